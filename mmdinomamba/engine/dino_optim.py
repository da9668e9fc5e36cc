"""Optimizer pieces for DINO: student-only parameter groups, DINO's per-parameter clipping and
a training step without host reads.

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

Neither wrapper reads a value to the host in the step: the per-parameter clipping is four
foreach ops (``_foreach_norm``, then ``min(max_norm / (norm + 1e-6), 1)`` as torch's
``clip_grad_norm_`` computes it, then ``_foreach_mul_``: bit for bit the per-parameter calls, and
DINO's ``if clip_coef < 1`` rule, as a factor of 1 changes nothing). ``grad_norm`` goes to the
message hub at once (mmengine's ``float(norm)``, a host read) unless ``defer_scalars`` is set:
:class:`~mmdinomamba.engine.hooks.DINORuntimeInfoHook` sets it when training starts, keeps the
norms (device tensors, :attr:`pending_scalars`) and moves them to the message hub at the
logging interval.
:class:`DINOAmpOptimWrapper` with ``dtype='bfloat16'`` builds no ``GradScaler``: bfloat16 has
float32's exponent range, so there is nothing to scale, and the scaler's ``step`` reads its
inf check to the host every iteration.
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


#: pending device scalars kept at most; beyond it they are written to the message hub at once
#: (one host read), so that a run without :class:`DINORuntimeInfoHook` does not pile them up
MAX_PENDING = 1024


class _PerParamClip:
    """Mixin: ``clip_grad=dict(max_norm=..., per_param=True)`` clips each parameter alone; the
    clipped norm is kept on the device (:attr:`pending_scalars`)."""

    def __init__(self, *args, clip_grad=None, **kwargs):
        clip_grad = dict(clip_grad) if clip_grad else None
        self.per_param_clip = bool(clip_grad and clip_grad.pop('per_param', False))
        if self.per_param_clip and clip_grad.get('type', 'norm') != 'norm':
            raise ValueError("clip_grad: per_param=True needs type='norm'")
        if self.per_param_clip and set(clip_grad) - {'type', 'max_norm'}:
            raise ValueError('clip_grad: per_param=True takes max_norm only (the 2-norm of '
                             f'DINO), got {sorted(set(clip_grad) - {"type", "max_norm"})}')
        super().__init__(*args, clip_grad=clip_grad, **kwargs)
        #: keep the logged norms on the device (set by DINORuntimeInfoHook, which reads them)
        self.defer_scalars = False
        #: (message hub key, 0-dim device tensor) of the steps not yet logged
        self.pending_scalars: list = []

    def pop_pending_scalars(self) -> list:
        """The (key, device tensor) pairs logged since the last call, oldest first."""
        pending, self.pending_scalars = self.pending_scalars, []
        return pending

    def flush_pending_scalars(self) -> None:
        """Write the pending scalars to the message hub (one host read for all of them)."""
        pending = self.pop_pending_scalars()
        if pending:
            values = torch.stack([v.detach().double() for _, v in pending]).tolist()
            for (key, _), value in zip(pending, values):
                self.message_hub.update_scalar(key, value)

    def _log_norm(self, norm: torch.Tensor) -> None:
        if not self.defer_scalars:
            return self.message_hub.update_scalar(f'train/{self.grad_name}', float(norm))
        self.pending_scalars.append((f'train/{self.grad_name}', norm))
        if len(self.pending_scalars) >= MAX_PENDING:
            self.flush_pending_scalars()

    def _clip_grad(self) -> None:
        params = [p for group in self.optimizer.param_groups for p in group['params']
                  if p.requires_grad and p.grad is not None]
        if not params:
            return
        if not self.per_param_clip:
            if self.clip_func is not torch.nn.utils.clip_grad_norm_:  # type='value'
                return super()._clip_grad()
            return self._log_norm(self.clip_func(params, **self.clip_grad_kwargs))
        self._log_norm(clip_per_param_(params, self.clip_grad_kwargs['max_norm']))


@torch.no_grad()
def clip_per_param_(params: list, max_norm: float) -> torch.Tensor:
    """DINO's ``clip_gradients``: every gradient scaled by ``min(max_norm / (norm + 1e-6), 1)``
    of its own 2-norm, with foreach ops (no host read). Returns the largest norm (0-dim).

    The coefficient is computed as ``torch.nn.utils.clip_grad_norm_`` computes it
    (``reciprocal(norm + 1e-6) * max_norm``, clamped at 1), so the result equals one
    ``clip_grad_norm_([p], max_norm)`` call per parameter bit for bit.
    """
    grads = [p.grad for p in params]
    norms = torch._foreach_norm(grads)
    coefs = torch._foreach_add(norms, 1e-6)
    torch._foreach_reciprocal_(coefs)
    torch._foreach_mul_(coefs, float(max_norm))
    torch._foreach_clamp_max_(coefs, 1.0)
    torch._foreach_mul_(grads, coefs)
    return torch.stack(norms).max()


class _NoScalerForBF16:
    """Mixin for ``AmpOptimWrapper``: with ``dtype='bfloat16'`` no ``GradScaler`` is built
    (nor needed), and the step is :class:`OptimWrapper`'s under bfloat16 autocast. Other dtypes
    keep mmengine's loss scaling. Checkpoints written with a scaler load (its state is
    dropped)."""

    def __init__(self, *args, loss_scale='dynamic', dtype=None, **kwargs):
        if dtype in ('bfloat16', torch.bfloat16):
            OptimWrapper.__init__(self, *args, **kwargs)  # skips the scaler (and CUDA check)
            self._scale_update_param = None
            self.loss_scaler = None
            self.cast_dtype = torch.bfloat16
        else:
            super().__init__(*args, loss_scale=loss_scale, dtype=dtype, **kwargs)

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        if self.loss_scaler is not None:
            return super().backward(loss, **kwargs)
        return OptimWrapper.backward(self, loss, **kwargs)

    def step(self, **kwargs) -> None:
        if self.loss_scaler is not None:
            return super().step(**kwargs)
        return OptimWrapper.step(self, **kwargs)

    def state_dict(self) -> dict:
        if self.loss_scaler is not None:
            return super().state_dict()
        return OptimWrapper.state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        if self.loss_scaler is not None:
            return super().load_state_dict(state_dict)
        state_dict = dict(state_dict)
        state_dict.pop('loss_scaler', None)
        return OptimWrapper.load_state_dict(self, state_dict)


@OPTIM_WRAPPERS.register_module()
class DINOOptimWrapper(_PerParamClip, OptimWrapper):
    """:class:`mmengine.optim.OptimWrapper` with optional per-parameter gradient clipping and
    the clipped norm logged without a host read in the step."""


@OPTIM_WRAPPERS.register_module()
class DINOAmpOptimWrapper(_PerParamClip, _NoScalerForBF16, AmpOptimWrapper):
    """:class:`mmengine.optim.AmpOptimWrapper` with optional per-parameter gradient clipping;
    no ``GradScaler`` for bfloat16."""
