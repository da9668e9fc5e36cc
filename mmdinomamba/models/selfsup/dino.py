"""DINO: self-distillation with no labels (Caron et al., ICCV 2021, arXiv:2104.14294).

The student (``backbone`` + ``head``) is trained to match, on every crop, the centered and
sharpened output of an EMA teacher (``teacher.backbone`` + ``teacher.head``) on the global crops.
All schedules (teacher temperature, teacher momentum, last-layer freeze) are pure functions of
the training progress that :class:`~mmdinomamba.engine.hooks.DINOTeacherHook` passes to
:meth:`DINO.set_progress` before every iteration; the same hook calls :meth:`DINO.update_teacher`
after the optimizer step. Teacher weights and the loss center are in the state dict, so
mmengine's ``--resume`` restores them.

No value is read to the host, and no tensor is made from host data, inside a training
iteration: the schedule values of the current iteration live in 0-dim device tensors (written
with ``fill_`` by :meth:`DINO.set_progress`), the teacher update is a pair of foreach ops on
them, and the logged scalars stay device tensors (the DINO runtime hooks read them every
logging interval).
"""
import copy
from typing import List, NamedTuple, Optional, Sequence

import torch
from mmpretrain.models.selfsup.base import BaseSelfSupervisor
from mmpretrain.registry import MODELS
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..heads.dino_loss import koleo_loss
from .dino_graphs import CropGraphs
from .dino_schedules import last_layer_frozen_at, teacher_momentum_at, teacher_temp_at

__all__ = ['DINO']


class Progress(NamedTuple):
    """Where training is: 0-based ``iteration``, ``max_iters`` and iterations per epoch."""
    iteration: int
    max_iters: int
    epoch_len: int


@MODELS.register_module()
class DINO(BaseSelfSupervisor):
    """DINO with an EMA teacher, multi-crop inputs and explicit schedules.

    Inputs (``mode='loss'``): a list of ``V`` view batches ``(B, 3, H_v, W_v)`` from
    :class:`~mmdinomamba.datasets.transforms.DINOMultiCrop`, the ``num_global_views`` global
    views first. Consecutive views of the same resolution go through the backbone as one batch;
    the teacher sees only the global views.

    Args:
        backbone (dict): backbone config; its output ``[-1]`` must be a (B, C) feature
            (``out_type`` 'cls_token' or 'avg_featmap').
        head (dict): projection head config (:class:`~mmdinomamba.models.heads.DINOHead`).
        loss (dict, optional): loss config; defaults to
            ``dict(type='DINOLoss', out_channels=head.out_channels)``.
        teacher_temp (float): teacher temperature after warm-up. Defaults to 0.04.
        warmup_teacher_temp (float): teacher temperature at epoch 0. Defaults to 0.04.
        warmup_teacher_temp_epochs (int): epochs of linear temperature warm-up (DINO indexes the
            temperature by epoch). Defaults to 0.
        momentum_teacher (float): teacher EMA momentum at iteration 0. Defaults to 0.996.
        final_momentum_teacher (float): momentum reached at the last iteration (cosine).
            Defaults to 1.0.
        freeze_last_layer (float): epochs during which the student head's last layer gets no
            gradient (DINO's ``freeze_last_layer``). Defaults to 1.
        num_global_views (int): global views (teacher inputs). Defaults to 2.
        koleo_weight (float): weight of the KoLeo regularizer (DINOv2) on the student's
            backbone features of each global view; 0 disables it. Defaults to 0.
        cuda_graphs (bool | dict): replay the backbone calls of training iterations as CUDA
            graphs, one per crop shape, after ``warmup_iters`` eager iterations
            (:class:`~mmdinomamba.models.selfsup.dino_graphs.CropGraphs`; a dict gives its
            arguments). Needs CUDA: an error without it. Defaults to False.
        data_preprocessor (dict, optional): Defaults to ``SelfSupDataPreprocessor``.
        init_cfg (dict, optional): init config of the whole model. When it is set (e.g. a DINO
            checkpoint), the teacher is NOT reset to the student in :meth:`init_weights`.
    """

    def __init__(self, backbone: dict, head: dict, loss: Optional[dict] = None,
                 teacher_temp: float = 0.04, warmup_teacher_temp: float = 0.04,
                 warmup_teacher_temp_epochs: int = 0, momentum_teacher: float = 0.996,
                 final_momentum_teacher: float = 1.0, freeze_last_layer: float = 1,
                 num_global_views: int = 2, koleo_weight: float = 0.,
                 cuda_graphs=False, data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(backbone=backbone, head=head, data_preprocessor=data_preprocessor,
                         init_cfg=init_cfg)
        out_type = getattr(self.backbone, 'out_type', 'cls_token')
        if out_type not in ('cls_token', 'avg_featmap'):
            raise ValueError(f"DINO: backbone out_type={out_type!r} does not give a (B, C) "
                             "feature; use 'cls_token' or 'avg_featmap'")
        loss = dict(loss or dict(type='DINOLoss'))
        loss.setdefault('out_channels', self.head.out_channels)
        loss.setdefault('num_global_views', num_global_views)
        self.dino_loss = MODELS.build(loss)
        self.teacher = nn.ModuleDict(
            dict(backbone=copy.deepcopy(self.backbone), head=copy.deepcopy(self.head)))
        self.teacher.requires_grad_(False)
        self.temp_cfg = dict(warmup_temp=warmup_teacher_temp, final_temp=teacher_temp,
                             warmup_epochs=warmup_teacher_temp_epochs)
        self.momentum_cfg = dict(base=momentum_teacher, final=final_momentum_teacher)
        self.freeze_last_layer = freeze_last_layer
        self.num_global_views = num_global_views
        self.koleo_weight = float(koleo_weight)
        self._progress: Optional[Progress] = None
        self.crop_graphs: Optional[CropGraphs] = None
        if cuda_graphs:
            if not torch.cuda.is_available():
                raise ValueError('DINO: cuda_graphs=True captures CUDA graphs and needs CUDA '
                                 '(torch.cuda.is_available() is False); set '
                                 'model.cuda_graphs=False on this machine')
            self.crop_graphs = CropGraphs(**(cuda_graphs if isinstance(cuda_graphs, dict)
                                             else {}))
        # this iteration's schedule values on the model's device (float64: dividing float32
        # logits by them rounds as dividing by the Python number does); not saved, set_progress
        # rewrites them before every iteration
        for name in ('_temp_t', '_momentum_t', '_one_minus_momentum_t'):
            self.register_buffer(name, torch.zeros((), dtype=torch.float64), persistent=False)

    # ---- progress and schedules ---------------------------------------------------------
    def set_progress(self, iteration: int, max_iters: int, epoch_len: int) -> None:
        """Tell the model which (0-based) iteration comes next. Called by ``DINOTeacherHook``
        before every training iteration; the schedules below are functions of this alone."""
        if not 0 <= iteration <= max_iters or epoch_len < 1:
            raise ValueError(f'DINO.set_progress: need 0 <= iteration ({iteration}) <= max_iters '
                             f'({max_iters}) and epoch_len ({epoch_len}) >= 1')
        self._progress = Progress(int(iteration), int(max_iters), int(epoch_len))
        momentum = self.momentum
        # fill_ passes the number as a kernel argument: no host-to-device copy
        self._temp_t.fill_(self.teacher_temp)
        self._momentum_t.fill_(momentum)
        self._one_minus_momentum_t.fill_(1. - momentum)

    @property
    def progress(self) -> Progress:
        if self._progress is None:
            if self.training:
                raise RuntimeError(
                    'DINO: training progress is unknown. Add the hook that drives the schedules '
                    "and the teacher update: custom_hooks=[dict(type='DINOTeacherHook')], or call "
                    'model.set_progress(iteration, max_iters, epoch_len) yourself.')
            return Progress(0, 1, 1)
        return self._progress

    @property
    def teacher_temp(self) -> float:
        """Teacher temperature of the current iteration."""
        p = self.progress
        return teacher_temp_at(p.iteration, p.epoch_len, **self.temp_cfg)

    @property
    def momentum(self) -> float:
        """Teacher EMA momentum of the current iteration."""
        p = self.progress
        return teacher_momentum_at(p.iteration, p.max_iters, **self.momentum_cfg)

    @property
    def last_layer_frozen(self) -> bool:
        p = self.progress
        return last_layer_frozen_at(p.iteration, p.epoch_len, self.freeze_last_layer)

    # ---- teacher ------------------------------------------------------------------------
    def _student_teacher_params(self) -> tuple[List[Tensor], List[Tensor]]:
        pairs = [(s, t) for name in ('backbone', 'head')
                 for s, t in zip(getattr(self, name).parameters(),
                                 self.teacher[name].parameters()) if s.requires_grad]
        return [s for s, _ in pairs], [t for _, t in pairs]

    def _schedule_tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """(teacher temperature, momentum, 1 - momentum) of this iteration as 0-dim device
        tensors; outside training without progress, those of iteration 0."""
        if self._progress is None:
            p = self.progress  # raises in training mode
            self.set_progress(p.iteration, p.max_iters, p.epoch_len)
            self._progress = None
        return self._temp_t, self._momentum_t, self._one_minus_momentum_t

    @torch.no_grad()
    def update_teacher(self, momentum: Optional[float] = None) -> None:
        """``teacher = m * teacher + (1 - m) * student`` for every trainable student parameter
        (frozen ones are equal in both and stay so). ``m`` defaults to :attr:`momentum`, taken
        from the device scalars that :meth:`set_progress` wrote (no host value in the step).

        Two foreach ops, bit for bit the per-parameter ``t.mul_(m).add_(s * (1 - m))``;
        ``torch._foreach_lerp_`` rounds differently (about 1 ulp), so it is not used.
        """
        if momentum is None:
            _, m, one_minus_m = self._schedule_tensors()
        else:
            m, one_minus_m = float(momentum), 1. - float(momentum)
        student, teacher = self._student_teacher_params()
        torch._foreach_mul_(teacher, m)
        torch._foreach_add_(teacher, torch._foreach_mul(student, one_minus_m))

    def init_weights(self) -> None:
        """Initialize the student, then make the teacher an exact copy of it (DINO starts both
        from the same weights) unless the whole model was loaded through ``init_cfg``."""
        super().init_weights()
        if self.init_cfg is None:
            for name in ('backbone', 'head'):
                self.teacher[name].load_state_dict(getattr(self, name).state_dict())

    def train(self, mode: bool = True):
        """The teacher runs in eval mode (no stochastic depth / dropout), except its BatchNorm
        layers (``DINOHead(use_bn=True)``), which normalize with batch statistics while training,
        as the official teacher does (it is never put in eval mode there)."""
        super().train(mode)
        self.teacher.eval()
        for m in self.teacher.modules():
            if isinstance(m, _BatchNorm):
                m.train(mode)
        return self

    # ---- forward ------------------------------------------------------------------------
    @staticmethod
    def _multicrop(backbone: nn.Module, head: nn.Module, views: Sequence[Tensor],
                   freeze_last_layer: bool = False, run=None) -> tuple[Tensor, Tensor]:
        """Backbone once per run of same-resolution views, head once.

        ``run(backbone, batch) -> feature`` makes the backbone call (default
        ``backbone(batch)[-1]``; the CUDA-graph replay with ``cuda_graphs``). Returns the
        backbone features (sum_v B, C) and head outputs (sum_v B, K), view-major.
        """
        feats, start = [], 0
        while start < len(views):
            stop = start + 1
            while stop < len(views) and views[stop].shape[-2:] == views[start].shape[-2:]:
                stop += 1
            batch = torch.cat(list(views[start:stop]))
            feats.append(backbone(batch)[-1] if run is None else run(backbone, batch))
            start = stop
        feats = torch.cat(feats)
        return feats, head(feats, detach_last_layer=freeze_last_layer)

    def loss(self, inputs: List[Tensor], data_samples=None) -> dict:
        """inputs: list of V view batches (B, 3, H_v, W_v) -> loss and logged scalars.

        Returns ``loss``, the teacher's collapse signals ``teacher_entropy`` (mean per-image
        entropy, nats), ``teacher_batch_entropy`` (entropy of the batch-mean distribution) and
        ``prototypes_used`` (distinct argmax prototypes in the batch), ``kl`` (teacher ||
        student), ``center_norm``, ``teacher_temp``, ``momentum`` and, with ``koleo_weight``,
        ``koleo`` (all scalars; only ``loss`` has a gradient). In training mode the loss center
        is updated after the loss.
        """
        G = self.num_global_views
        if not isinstance(inputs, (list, tuple)) or len(inputs) <= G:
            raise ValueError(f'DINO.loss: expected a list of more than {G} view batches (global '
                             f'views first), got {type(inputs).__name__} of length '
                             f'{len(inputs) if isinstance(inputs, (list, tuple)) else "-"}')
        temp, momentum, _ = self._schedule_tensors()
        graphs = self.crop_graphs if self.training else None
        if graphs is not None:
            graphs.start_iteration()
        with torch.no_grad():
            _, teacher_out = self._multicrop(self.teacher['backbone'], self.teacher['head'],
                                             inputs[:G], run=graphs and graphs.teacher)
        student_feats, student_out = self._multicrop(
            self.backbone, self.head, inputs,
            freeze_last_layer=self.training and self.last_layer_frozen,
            run=graphs and graphs.student)
        losses = self.dino_loss(student_out, teacher_out, temp)
        if self.koleo_weight > 0:
            global_feats = student_feats[:teacher_out.shape[0]].chunk(G)
            koleo = sum(koleo_loss(f) for f in global_feats) / G
            losses['loss'] = losses['loss'] + self.koleo_weight * koleo
            losses['koleo'] = koleo.detach()
        if self.training:
            self.dino_loss.update_center(teacher_out)
        # logged copies in the logits' dtype (as new_tensor(number) gave), made on the device
        losses.update(center_norm=self.dino_loss.center.norm(),
                      teacher_temp=temp.to(teacher_out.dtype, copy=True),
                      momentum=momentum.to(teacher_out.dtype, copy=True))
        return losses
