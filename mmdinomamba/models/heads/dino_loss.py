"""DINO loss: cross-entropy between centered, sharpened teacher and student distributions.

Caron et al., ICCV 2021 (https://arxiv.org/abs/2104.14294), Eq. (2)-(4) and Algorithm 1.
"""
import torch
import torch.nn.functional as F
from mmengine import dist
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['DINOLoss']


def _full(x: Tensor) -> Tensor:
    """float16 / bfloat16 logits (AMP) -> float32; float32 / float64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


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

    ``center`` is a registered buffer, so it is saved in and restored from checkpoints.

    Args:
        out_channels (int): output dimension K of the projection head.
        student_temp (float): student temperature. Defaults to 0.1.
        center_momentum (float): EMA momentum ``m`` of the center. Defaults to 0.9.
        num_global_views (int): teacher (global) views. Defaults to 2.
    """

    def __init__(self, out_channels: int, student_temp: float = 0.1,
                 center_momentum: float = 0.9, num_global_views: int = 2):
        super().__init__()
        if not 0 <= center_momentum <= 1:
            raise ValueError(f'DINOLoss: center_momentum={center_momentum} must be in [0, 1]')
        self.out_channels, self.student_temp = out_channels, student_temp
        self.center_momentum, self.num_global_views = center_momentum, num_global_views
        self.register_buffer('center', torch.zeros(1, out_channels))

    def forward(self, student_out: Tensor, teacher_out: Tensor, teacher_temp: float) -> dict:
        """Loss and collapse diagnostics (the center is NOT updated here).

        Args:
            student_out (Tensor): (V * B, K) student logits, view-major
                (``[view 0 batch; view 1 batch; ...]``), global views first.
            teacher_out (Tensor): (G * B, K) teacher logits of the G global views, view-major.
            teacher_temp (float): teacher temperature of this iteration.

        Returns:
            dict: ``loss`` (scalar with gradient), and detached scalars ``teacher_entropy``
            (mean entropy of P_t in nats) and ``kl`` (mean over pairs of KL(P_t || P_s)).
        """
        G = self.num_global_views
        if teacher_out.shape[0] % G or student_out.shape[0] % (teacher_out.shape[0] // G):
            raise ValueError(f'DINOLoss: teacher batch {teacher_out.shape[0]} is not {G} views '
                             f'of the student batch {student_out.shape[0]}')
        B = teacher_out.shape[0] // G
        V = student_out.shape[0] // B
        log_p_s = F.log_softmax(_full(student_out) / self.student_temp, dim=-1).chunk(V)
        log_p_t = F.log_softmax((_full(teacher_out) - self.center) / teacher_temp, dim=-1)
        p_t = log_p_t.exp().detach()
        total, pairs = 0., 0
        for i, q in enumerate(p_t.chunk(G)):
            for v in range(V):
                if v == i:
                    continue
                total = total + torch.sum(-q * log_p_s[v], dim=-1).mean()
                pairs += 1
        loss = total / pairs
        with torch.no_grad():
            entropy = -(p_t * log_p_t).sum(dim=-1).mean()
        return dict(loss=loss, teacher_entropy=entropy, kl=loss.detach() - entropy)

    @torch.no_grad()
    def update_center(self, teacher_out: Tensor) -> None:
        """EMA of the batch mean of the teacher logits (all processes). teacher_out: (N, K)."""
        batch_sum = teacher_out.float().sum(dim=0, keepdim=True)
        dist.all_reduce(batch_sum, op='sum')
        batch_center = batch_sum / (teacher_out.shape[0] * dist.get_world_size())
        m = self.center_momentum
        self.center.mul_(m).add_(batch_center * (1 - m))
