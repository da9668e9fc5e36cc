"""The exact token-mixing matrices of :class:`~mmdinomamba.models.mixers.BiSSD` (analysis)."""
import torch
from torch import Tensor

from mmdinomamba.ops import ssd_decay_matrix, ssd_mixing_matrix
from mmdinomamba.ops.reference.mixer import conv_scan_inputs

__all__ = ['BiSSDMatrices']


class BiSSDMatrices:
    """Mixing matrices of a bidirectional Mamba-2 mixer, built from the specification's scan
    problem of both directions (the reference's conv)."""

    def _scan_inputs(self, xBC: Tensor, dt: Tensor) -> tuple:
        """Both directions as one SSD problem of 2*nheads heads and 2*ngroups groups: ``u``
        (B, L, 2h, p), ``dt`` (B, L, 2h) after softplus, ``A`` (2h,), ``B``, ``C`` (B, L, 2g,
        n) and ``D`` (2h,); heads ``[h, 2h)`` are the backward direction on the flipped
        sequence."""
        dt_bias, A, D, _ = self._direction_params()
        ct = torch.promote_types(dt.dtype, torch.float32)
        u, dt, Bm, Cm = conv_scan_inputs(xBC, *self._conv_params(), torch.cat([dt, dt.flip(1)], -1),
                                         dt_bias.flatten(), self.dims.splits, self.headdim,
                                         self.d_state)
        return u, dt, A.flatten().to(ct), Bm, Cm, D.flatten()

    def _problem(self, x: Tensor) -> tuple:
        """``z`` and the scan problem of both directions for the analysis methods."""
        z, xBC, dt = self._project(x)
        return (z, ) + self._scan_inputs(xBC, dt)

    @torch.no_grad()
    def mixing_matrices(self, x: Tensor, hw: tuple[int, int] | None = None) -> dict:
        """Each direction's matrix and the values it is applied to: the EXACT per-direction map.

        Returns a dict (all in the ORIGINAL token order):

        * ``forward``, ``backward``: (B, nheads, L, L) ``M`` of each direction including its
          ``D`` on the diagonal; ``forward`` is lower and ``backward`` upper triangular;
        * ``value_forward``, ``value_backward``: (B, L, nheads, headdim) the conv outputs each
          direction scans (they differ: each direction has its own causal conv);
        * ``gate``: (B, L, d_inner) ``z``.

        Exactly (up to rounding): ``M_dir @ value_dir`` per head is that direction's scan
        output before its gated RMSNorm, ``y_dir``; the mixer output is
        ``out_proj((norm(y_fwd, z) + norm_b(y_bwd, z)) / 2)`` (with ``rmsnorm=False``:
        ``out_proj((y_fwd + y_bwd) / 2 * silu(z))``).
        """
        z, u, dt, A, Bm, Cm, D = self._problem(x)
        h, g = self.num_heads, self.ngroups
        mats, ct = [], dt.dtype
        for s, sg in ((slice(0, h), slice(0, g)), (slice(h, None), slice(g, None))):
            M = ssd_mixing_matrix(dt[:, :, s], A[s], Bm[:, :, sg].to(ct), Cm[:, :, sg].to(ct))
            mats.append(M + torch.diag_embed(D[s].to(ct)[:, None].expand(-1, M.shape[-1])))
        return dict(
            forward=mats[0],
            backward=mats[1].flip(-1).flip(-2),
            value_forward=u[:, :, :h],
            value_backward=u[:, :, h:].flip(1),
            gate=z)

    @torch.no_grad()
    def decay_masks(self, x: Tensor, hw: tuple[int, int] | None = None) -> dict:
        """Each direction's decay mask ``L_M`` (Mamba-2's learnable causal mask), float64.

        Returns:
            dict: ``forward`` (B, nheads, L, L) lower triangular,
            ``L[i, j] = exp(sum_{k=j+1..i} dt_k A)``, so that ``mixing_matrices(x)['forward']``
            is ``L o (C B^T) o dt_j`` below the diagonal; ``backward`` the same for the backward
            direction in the original token order (upper triangular). Ones on the diagonals.
        """
        _, _, dt, A = self._problem(x)[:4]
        h = self.num_heads
        return dict(forward=ssd_decay_matrix(dt[..., :h], A[:h]),
                    backward=ssd_decay_matrix(dt[..., h:], A[h:]).flip(-1).flip(-2))

    @torch.no_grad()
    def mixing_matrix(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """``M = (M_fwd + M_bwd) / 2`` (B, nheads, L, L): the two directions' matrices averaged.

        This is the combined map that Binary-AUC and the rank analysis read for BiSSD (Mamba's
        "hidden attention": the forward direction below the diagonal, the backward one above
        it, the mean of both ``D``-augmented diagonals on it). It is NOT an exact map of the
        mixer's input to its output: the two directions scan different values (each has its own
        causal conv) and each direction's gated RMSNorm sits between its scan and the average,
        so neither ``M @ value_forward`` nor any single ``M @ v`` reproduces the output in
        general. It is exact only without the norm (``rmsnorm=False``) AND with equal values in
        both directions, where ``out_proj((M @ v) * silu(z))`` is the output. The exact
        per-direction maps are :meth:`mixing_matrices`.
        """
        mats = self.mixing_matrices(x, hw)
        return (mats['forward'] + mats['backward']) / 2
