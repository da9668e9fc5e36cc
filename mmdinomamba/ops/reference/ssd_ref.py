"""The specification of the Mamba-2 SSD scan: a naive sequential recurrence and its matrix form.

Mamba-2 (Dao & Gu, "Transformers are SSMs", https://arxiv.org/abs/2405.21060) computes, per head,

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T      (state h_t: (n, p))
    y_t = C_t h_t + D x_t

which unrolls to ``y = M x + D x`` with the lower-triangular semiseparable matrix

    M_ij = (C_i . B_j) exp(sum_{k=j+1..i} dt_k A) dt_j     for i >= j, else 0.

The recurrence and the matrices here are slow on purpose and only used as references (tests,
analysis); the chunked scan (:mod:`.ssd_chunked`) is the reference for long sequences.
"""
import torch
from torch import Tensor

__all__ = ['ssd_scan_ref', 'ssd_mixing_matrix', 'ssd_decay_matrix', 'check_ssd_shapes',
           'ssd_scan_quadratic_ref']


def check_ssd_shapes(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                     D: Tensor | None = None) -> None:
    """Raise a ``ValueError`` naming the argument whose shape breaks the SSD contract."""
    if x.dim() != 4:
        raise ValueError(f'x must be (batch, length, heads, headdim), got shape {tuple(x.shape)}')
    b, length, h, _ = x.shape
    if dt.shape != (b, length, h):
        raise ValueError(f'dt must be {(b, length, h)} to match x, got {tuple(dt.shape)}')
    if A.shape != (h, ):
        raise ValueError(f'A must be ({h},) (one value per head), got {tuple(A.shape)}')
    if B.dim() != 4 or B.shape[:2] != (b, length):
        raise ValueError(f'B must be (batch={b}, length={length}, groups, state), '
                         f'got {tuple(B.shape)}')
    if C.shape != B.shape:
        raise ValueError(f'C must have the shape of B {tuple(B.shape)}, got {tuple(C.shape)}')
    if h % B.shape[2] != 0:
        raise ValueError(f'heads ({h}) must be a multiple of groups ({B.shape[2]})')
    if D is not None and D.shape != (h, ):
        raise ValueError(f'D must be ({h},) or None, got {tuple(D.shape)}')


def _heads_view(t: Tensor, heads: int) -> Tensor:
    """(b, L, g, n) -> (b, L, heads, n): head i reads group i // (heads // g)."""
    return t.repeat_interleave(heads // t.shape[2], dim=2)


def ssd_scan_ref(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                 D: Tensor | None = None) -> Tensor:
    """Naive sequential SSD recurrence (the specification; O(L) Python steps).

    Computes in the dtype of ``x`` (pass float64 tensors for a high-precision reference);
    differentiable with autograd.

    Args:
        x (Tensor): (batch, length, heads, headdim) inputs.
        dt (Tensor): (batch, length, heads) positive step sizes (softplus already applied).
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state) input projections; heads % groups == 0.
        C (Tensor): (batch, length, groups, state) output projections.
        D (Tensor, optional): (heads,) skip weights. Defaults to None (no skip).

    Returns:
        Tensor: (batch, length, heads, headdim) outputs ``y``.
    """
    check_ssd_shapes(x, dt, A, B, C, D)
    b, length, h, p = x.shape
    Bh, Ch = _heads_view(B, h), _heads_view(C, h)
    state = x.new_zeros(b, h, Bh.shape[-1], p)
    ys = []
    # unbind, not x[:, t]: one backward for all steps, not a full-size gradient per step
    for x_t, dt_t, B_t, C_t in zip(x.unbind(1), dt.unbind(1), Bh.unbind(1), Ch.unbind(1)):
        inp = (dt_t[..., None, None] * B_t[..., :, None]) * x_t[..., None, :]
        state = state * torch.exp(dt_t * A)[..., None, None] + inp
        ys.append(torch.einsum('bhn,bhnp->bhp', C_t, state))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape)
    if D is not None:
        y = y + x * D[:, None]
    return y


def ssd_decay_matrix(dt: Tensor, A: Tensor) -> Tensor:
    """Mamba-2's causal decay mask ``L_M`` of the SSD scan, in float64.

    ``L_M[b, h, i, j] = exp(sum_{k=j+1..i} dt[b, k, h] * A[h])`` for ``i >= j``, else 0 (so
    that ``ssd_mixing_matrix = L_M o (C B^T) o dt_j``).

    Args:
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.

    Returns:
        Tensor: (batch, heads, length, length) float64 lower-triangular mask.
    """
    if dt.dim() != 3 or A.shape != (dt.shape[-1], ):
        raise ValueError(f'ssd_decay_matrix: dt must be (B, L, h) and A (h,), '
                         f'got dt {tuple(dt.shape)}, A {tuple(A.shape)}')
    cs = torch.cumsum(dt.double() * A.double(), dim=1).transpose(1, 2)  # (B, h, L)
    seg = cs[..., :, None] - cs[..., None, :]
    causal = torch.ones(seg.shape[-2:], dtype=torch.bool, device=dt.device).tril()
    return torch.exp(seg.masked_fill(~causal, float('-inf')))


def ssd_mixing_matrix(dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The semiseparable matrix ``M`` of the SSD scan (without ``D``): ``y = M x + D x``.

    ``M[b, h, i, j] = (C_i . B_j) * exp(sum_{k=j+1..i} dt_k A_h) * dt_j`` for ``i >= j``, else 0.
    The decay exponents are differences of float64 cumulative sums, so entries are accurate
    for long sequences too. Memory: O(batch * heads * L^2) (analysis only).

    Args:
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state).
        C (Tensor): (batch, length, groups, state).

    Returns:
        Tensor: (batch, heads, length, length) lower-triangular ``M`` in the dtype of ``dt``
        (rows = output tokens, columns = input tokens).
    """
    b, length, h = dt.shape
    if A.shape != (h, ) or B.shape[:2] != (b, length) or C.shape != B.shape:
        raise ValueError(f'ssd_mixing_matrix: inconsistent shapes dt {tuple(dt.shape)}, '
                         f'A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}')
    g = B.shape[2]
    if h % g != 0:
        raise ValueError(f'heads ({h}) must be a multiple of groups ({g})')
    cb = torch.einsum('bign,bjgn->bgij', C, B).repeat_interleave(h // g, dim=1)  # (b, h, L, L)
    return cb * ssd_decay_matrix(dt, A).to(dt.dtype) * dt.transpose(1, 2)[:, :, None, :]


def ssd_scan_quadratic_ref(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           D: Tensor | None = None) -> Tensor:
    """The SSD scan in its quadratic form, ``y = M x + D x`` with ``M`` of
    :func:`ssd_mixing_matrix` (the arguments and result of :func:`ssd_scan_ref`; memory grows
    with ``L^2``)."""
    check_ssd_shapes(x, dt, A, B, C, D)
    y = torch.einsum('bhij,bjhp->bihp', ssd_mixing_matrix(dt, A, B, C).to(x.dtype), x)
    return y if D is None else y + x * D[:, None].to(x.dtype)
