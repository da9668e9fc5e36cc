"""DINO loss: cross-entropy between centered, sharpened teacher and student distributions.

Caron et al., ICCV 2021 (https://arxiv.org/abs/2104.14294), Eq. (2)-(4) and Algorithm 1; the
Sinkhorn-Knopp teacher of DINOv2 (Oquab et al., 2023, https://arxiv.org/abs/2304.07193) as an
option for small batches.
"""
import math
from typing import Union

import torch
import torch.nn.functional as F
from mmengine import dist
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['DINOLoss', 'koleo_loss', 'sinkhorn_knopp', 'teacher_collapse_signals']

CENTERINGS = ('ema', 'sinkhorn_knopp')


def _full(x: Tensor) -> Tensor:
    """float16 / bfloat16 logits (AMP) -> float32; float32 / float64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


#: A temperature: a Python number or a 0-dim tensor on the logits' device (the DINO model passes
#: a device scalar, so that no value travels from the host during the step).
Temperature = Union[float, Tensor]


@torch.no_grad()
def sinkhorn_knopp(logits: Tensor, temp: Temperature, num_iters: int = 3) -> Tensor:
    """Balanced soft assignment of N samples to K prototypes (DINOv2's teacher).

    ``Q = exp(logits / temp)``, then ``num_iters`` rounds of: every prototype's total mass set
    to ``1 / K`` (sums over all processes), every sample's mass set to ``1 / N``. Returns
    ``N * Q``: each row is a distribution over the K prototypes, and over the (global) batch
    every prototype receives the same total mass.

    Args:
        logits (Tensor): (N, K) teacher logits of this process.
        temp (float | Tensor): teacher temperature (a number or a 0-dim tensor).
        num_iters (int): normalization rounds. Defaults to 3.

    Returns:
        Tensor: (N, K) row-stochastic targets.
    """
    z = _full(logits) / temp
    q = torch.exp(z - z.max()).T  # (K, N); a global shift cancels in the normalizations
    # the global sample count stays on the device (no host read, no host-made tensor)
    n = q.new_full((), q.shape[1], dtype=torch.long)
    dist.all_reduce(n, op='sum')
    total = q.sum()
    dist.all_reduce(total, op='sum')
    q = q / total
    k = q.shape[0]
    for _ in range(num_iters):
        rows = q.sum(dim=1, keepdim=True)
        dist.all_reduce(rows, op='sum')
        q = q / rows / k
        q = q / q.sum(dim=0, keepdim=True) / n
    return (q * n).T


@torch.no_grad()
def teacher_collapse_signals(p_t: Tensor) -> dict:
    """What tells a collapsed teacher from a healthy one, from its output distributions.

    Args:
        p_t (Tensor): (N, K) teacher distributions (rows sum to 1).

    Returns:
        dict: ``teacher_entropy`` (mean per-sample entropy, nats: near log K = uniform collapse),
        ``teacher_batch_entropy`` (entropy of the batch-mean distribution, nats: near 0 =
        one-dimension collapse, every sample on the same prototypes) and ``prototypes_used``
        (how many prototypes are some sample's argmax). All float tensors, computed on the
        device of ``p_t`` without reading anything to the host (the prototypes in use are
        counted by marking K bins, not with ``torch.unique``).
    """
    p = p_t.double()
    per_sample = -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1).mean()
    mean = p.mean(dim=0)
    batch = -(mean * torch.log(mean.clamp_min(1e-30))).sum()
    used = p_t.new_zeros(p_t.shape[-1]).scatter_(0, p.argmax(dim=-1), 1.).sum()
    return dict(teacher_entropy=per_sample.to(p_t.dtype),
                teacher_batch_entropy=batch.to(p_t.dtype),
                prototypes_used=used)


@MODELS.register_module()
class DINOLoss(nn.Module):
    """DINO's cross-entropy with teacher centering.

    With student views ``s_v`` (v = 0..V-1, the first two are the global views) and teacher
    views ``t_i`` (i = 0, 1; the global views)::

        P_t,i = softmax((t_i - center) / teacher_temp)         (no gradient)
        P_s,v = softmax(s_v / student_temp)
        loss  = mean over pairs (i, v), v != i, of  mean_batch sum_k -P_t,i[k] log P_s,v[k]

    i.e. ``2 (V - 1)`` pairs. After the loss, :meth:`update_center` moves the ``center``
    buffer towards the batch mean of the teacher logits, averaged over all processes with
    ``mmengine.dist.all_reduce`` (a no-op on one process):
    ``center = m * center + (1 - m) * mean(t)``.

    ``centering='sinkhorn_knopp'`` replaces the centered softmax by DINOv2's balanced
    assignment :func:`sinkhorn_knopp` of the teacher logits (the center is then unused): every
    prototype gets the same share of every batch, which keeps a small batch from piling onto a
    few prototypes.

    ``center`` is a registered buffer, so it is saved in and restored from checkpoints. The
    collapse signals (:func:`teacher_collapse_signals`) are those of the targets with 'ema' and
    of the plain softmax ``softmax(t / teacher_temp)`` with 'sinkhorn_knopp' (whose targets are
    balanced whatever the teacher does).

    Args:
        out_channels (int): output dimension K of the projection head.
        student_temp (float): student temperature. Defaults to 0.1.
        center_momentum (float): EMA momentum ``m`` of the center. Defaults to 0.9.
        num_global_views (int): teacher (global) views. Defaults to 2.
        centering (str): 'ema' (DINO) or 'sinkhorn_knopp' (DINOv2). Defaults to 'ema'.
        sinkhorn_iters (int): Sinkhorn-Knopp rounds. Defaults to 3.
    """

    def __init__(self, out_channels: int, student_temp: float = 0.1,
                 center_momentum: float = 0.9, num_global_views: int = 2,
                 centering: str = 'ema', sinkhorn_iters: int = 3):
        super().__init__()
        if not 0 <= center_momentum <= 1:
            raise ValueError(f'DINOLoss: center_momentum={center_momentum} must be in [0, 1]')
        if centering not in CENTERINGS:
            raise ValueError(f'DINOLoss: centering={centering!r} is not one of {CENTERINGS}')
        self.out_channels, self.student_temp = out_channels, student_temp
        self.center_momentum, self.num_global_views = center_momentum, num_global_views
        self.centering, self.sinkhorn_iters = centering, sinkhorn_iters
        self.register_buffer('center', torch.zeros(1, out_channels))

    def teacher_probs(self, teacher_out: Tensor, teacher_temp: Temperature) -> Tensor:
        """(N, K) teacher logits -> (N, K) target distributions (no gradient)."""
        if self.centering == 'sinkhorn_knopp':
            return sinkhorn_knopp(teacher_out.detach(), teacher_temp, self.sinkhorn_iters)
        return F.softmax((_full(teacher_out.detach()) - self.center) / teacher_temp, dim=-1)

    def forward(self, student_out: Tensor, teacher_out: Tensor,
                teacher_temp: Temperature) -> dict:
        """Loss and collapse diagnostics (the center is NOT updated here).

        Args:
            student_out (Tensor): (V * B, K) student logits, view-major
                (``[view 0 batch; view 1 batch; ...]``), global views first.
            teacher_out (Tensor): (G * B, K) teacher logits of the G global views, view-major.
            teacher_temp (float | Tensor): teacher temperature of this iteration (a number or
                a 0-dim tensor on the logits' device).

        Returns:
            dict: ``loss`` (scalar with gradient), the detached signals of
            :func:`teacher_collapse_signals` and ``kl`` (mean over pairs of KL(P_t || P_s)).
        """
        G = self.num_global_views
        if teacher_out.shape[0] % G or student_out.shape[0] % (teacher_out.shape[0] // G):
            raise ValueError(f'DINOLoss: teacher batch {teacher_out.shape[0]} is not {G} views '
                             f'of the student batch {student_out.shape[0]}')
        B = teacher_out.shape[0] // G
        V = student_out.shape[0] // B
        log_p_s = F.log_softmax(_full(student_out) / self.student_temp, dim=-1).chunk(V)
        p_t = self.teacher_probs(teacher_out, teacher_temp)
        total, pairs = 0., 0
        for i, q in enumerate(p_t.chunk(G)):
            for v in range(V):
                if v == i:
                    continue
                total = total + torch.sum(-q * log_p_s[v], dim=-1).mean()
                pairs += 1
        loss = total / pairs
        # Sinkhorn-Knopp targets are balanced by construction: watch the raw teacher instead.
        signals = teacher_collapse_signals(
            p_t if self.centering == 'ema' else F.softmax(_full(teacher_out.detach()) /
                                                          teacher_temp, dim=-1))
        return dict(loss=loss, **signals, kl=loss.detach() - signals['teacher_entropy'])

    @torch.no_grad()
    def update_center(self, teacher_out: Tensor) -> None:
        """EMA of the batch mean of the teacher logits (all processes). teacher_out: (N, K)."""
        batch_sum = teacher_out.float().sum(dim=0, keepdim=True)
        dist.all_reduce(batch_sum, op='sum')
        batch_center = batch_sum / (teacher_out.shape[0] * dist.get_world_size())
        m = self.center_momentum
        self.center.mul_(m).add_(batch_center * (1 - m))


def koleo_loss(feats: Tensor, eps: float = 1e-8) -> Tensor:
    """KoLeo regularizer (Sablayrolles et al., 2019; DINOv2): ``-mean_i log(min_j ||x_i - x_j||)``
    of the L2-normalized features ``feats`` (N, D), j != i. Spreads the features uniformly."""
    x = F.normalize(_full(feats), dim=-1, eps=eps)
    with torch.no_grad():
        sim = x @ x.T
        sim.fill_diagonal_(-math.inf)
        nn_idx = sim.argmax(dim=1)
    dist_nn = (x - x[nn_idx]).norm(dim=-1)
    return -torch.log(dist_nn + eps).mean()
