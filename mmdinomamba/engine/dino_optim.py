"""Optimizer pieces for DINO: student-only parameter groups and DINO's per-parameter clipping.

* :class:`DINOOptimWrapperConstructor`: mmengine's ``DefaultOptimWrapperConstructor`` with a
  ``paramwise_cfg`` walks the whole model and prints a warning for every parameter without
  gradient, i.e. for the whole EMA teacher. This constructor gives it the student only
  (``backbone``, ``neck``, ``head``: names unchanged, so ``custom_keys`` work as usual). Use
  ``paramwise_cfg=dict(flat_decay_mult=0.)`` for DINO's rule "no weight decay for biases and
  1-D parameters" (facebookresearch/dino ``get_params_groups``).
* :class:`DINOOptimWrapper` / :class:`DINOAmpOptimWrapper`: mmengine's wrappers with
  ``clip_grad=dict(max_norm=3.0, per_param=True)``: every parameter's gradient is clipped to
  norm ``max_norm`` on its own (facebookresearch/dino ``clip_gradients``), instead of the global
  norm. The logged ``grad_norm`` is then the largest per-parameter norm before clipping.
"""
import torch
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, DefaultOptimWrapperConstructor, OptimWrapper
from mmpretrain.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS
from mmpretrain.utils import get_ori_model

from ..utils.quiet import without_log_messages
from torch import nn

__all__ = ['DINOOptimWrapperConstructor', 'DINOOptimWrapper', 'DINOAmpOptimWrapper']


class _StudentView(nn.Module):
    """Holds references to the student's submodules (no copies)."""

    def __init__(self, model: nn.Module, names: tuple):
        super().__init__()
        for name in names:
            module = getattr(model, name, None)
            if module is not None:
                self.add_module(name, module)


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class DINOOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """:class:`DefaultOptimWrapperConstructor` over ``model.{backbone, neck, head}`` only
    (``student_modules``); arguments as for the default constructor."""
    student_modules = ('backbone', 'neck', 'head')

    def __call__(self, model: nn.Module):
        model = get_ori_model(model)
        view = _StudentView(model, self.student_modules)
        if not any(True for _ in view.parameters()):
            raise ValueError(f'DINOOptimWrapperConstructor: {type(model).__name__} has none of '
                             f'the submodules {self.student_modules}')
        frozen = [name for name, p in view.named_parameters() if not p.requires_grad]
        # mmengine warns once per frozen parameter; they are listed once below instead
        with without_log_messages('is skipped since its requires_grad=False'):
            wrapper = super().__call__(view)
        if frozen:  # DINO's head: the last layer's weight norm is fixed (norm_last_layer)
            print_log(f'DINOOptimWrapperConstructor: frozen, not optimized: {frozen}',
                      logger='current')
        return wrapper


class _PerParamClip:
    """Mixin: ``clip_grad=dict(max_norm=..., per_param=True)`` clips each parameter alone."""

    def __init__(self, *args, clip_grad=None, **kwargs):
        clip_grad = dict(clip_grad) if clip_grad else None
        self.per_param_clip = bool(clip_grad and clip_grad.pop('per_param', False))
        if self.per_param_clip and clip_grad.get('type', 'norm') != 'norm':
            raise ValueError("clip_grad: per_param=True needs type='norm'")
        super().__init__(*args, clip_grad=clip_grad, **kwargs)

    def _clip_grad(self) -> None:
        if not self.per_param_clip:
            return super()._clip_grad()
        params = [p for group in self.optimizer.param_groups for p in group['params']
                  if p.requires_grad and p.grad is not None]
        if params:
            norms = [self.clip_func([p], **self.clip_grad_kwargs) for p in params]
            self.message_hub.update_scalar(f'train/{self.grad_name}',
                                           float(torch.stack(norms).max()))


@OPTIM_WRAPPERS.register_module()
class DINOOptimWrapper(_PerParamClip, OptimWrapper):
    """:class:`mmengine.optim.OptimWrapper` with optional per-parameter gradient clipping."""


@OPTIM_WRAPPERS.register_module()
class DINOAmpOptimWrapper(_PerParamClip, AmpOptimWrapper):
    """:class:`mmengine.optim.AmpOptimWrapper` with optional per-parameter gradient clipping."""
