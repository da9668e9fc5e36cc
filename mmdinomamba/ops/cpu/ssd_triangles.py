"""The (L, L) matrix products of the quadratic SSD form, without their zero half.

The group matrices ``cb`` of :mod:`.ssd_quadratic` are strictly lower (causal direction,
``R`` index 0) or strictly upper (anti-causal, index 1) triangular, so half of each product
with them adds zeros. Cutting the tokens into ``k`` blocks and skipping the blocks that are
all zero leaves ``(k + 1) / (2 k)`` of the work (two thirds for three blocks, five eighths
for four) in a few larger GEMMs; every product adds the same non-zero terms as the full one, so
results agree to rounding. Sequences shorter than ``2 * MIN_BLOCK`` tokens keep the one full
product.

Layout: ``(b, R, g, P, L)`` operands and ``(b, R, g, L, L)`` matrices; the blocks are products
of 3-d views (one direction and group), written into the result. With ``native`` (the CPU fast
path) and several blocks, each function is one call of a native kernel
(:func:`.native_cpu.column_products`, :func:`.native_cpu.masked_outer`) that runs every block
product of every sample as a task of its own and writes it in place.
"""
import torch
from torch import Tensor

from . import native_cpu

__all__ = ['BLOCKS', 'MIN_BLOCK', 'block_bounds', 'native_blocks', 'apply_masked',
           'apply_masked_t', 'masked_outer', 'mask_triangles']

#: At most this many blocks, of at least ``MIN_BLOCK`` tokens (docs/results.md has the timings).
BLOCKS = 4
MIN_BLOCK = 64
#: Inner block boundaries fall on multiples of this (CPU GEMMs run faster on such widths).
ALIGN = 16


def block_bounds(length: int) -> list[int]:
    """Token boundaries of the blocks: ``BLOCKS`` near-equal blocks with inner boundaries on
    multiples of ``ALIGN`` (0, 64, 128, 197 at 197 tokens), or one block when that would make
    them shorter than ``MIN_BLOCK``."""
    k = max(1, min(BLOCKS, length // MIN_BLOCK))
    inner = [ALIGN * round(i * length / k / ALIGN) for i in range(1, k)]
    return [0, *inner, length]


def native_blocks(native: bool, bounds: list[int], *tensors: Tensor) -> bool:
    """Whether a product runs in the native kernel (:func:`.native_cpu.column_products`,
    :func:`.native_cpu.masked_outer`): asked to (``native``), operands that suit it, and
    several blocks. With one block PyTorch's batched GEMM of the contiguous operands is as
    fast or faster (docs/results.md)."""
    return native and len(bounds) > 2 and native_cpu.planes_fit(*tensors)


def _views(*tensors: Tensor):
    """(direction, group, the 3-d (b, ., .) views of every tensor) for each direction and
    group."""
    directions, groups = tensors[0].shape[1:3]
    for r in range(directions):
        for gi in range(groups):
            yield r, [t[:, r, gi] for t in tensors]


def _columns(a: Tensor, m: Tensor, out: Tensor, bounds: list[int], prefix: bool) -> None:
    """``out = a @ m`` (b, P, K) @ (b, K, N) for ``m`` zero below (``prefix``: column block
    ``j`` reads rows ``:j1``) or above (rows ``j0:``) its diagonal blocks."""
    for j0, j1 in zip(bounds, bounds[1:]):
        rows = slice(0, j1) if prefix else slice(j0, None)
        out[..., j0:j1] = torch.matmul(a[..., rows], m[..., rows, j0:j1])


def apply_masked(x: Tensor, cb: Tensor, native: bool = False) -> Tensor:
    """``x @ cb^T`` per direction and group: ``x`` (b, R, g, P, L), ``cb`` (b, R, g, L, L)
    masked to each direction's strict triangle (``native``: in the native CPU kernel where the
    operands suit it, :func:`.native_cpu.column_products`)."""
    bounds = block_bounds(x.shape[-1])
    if native_blocks(native, bounds, x, cb):
        return native_cpu.column_products(x, cb, bounds, transpose=True, prefix_first=True)
    if len(bounds) == 2:
        return torch.matmul(x, cb.mT)
    out = x.new_empty(x.shape)
    for r, (xv, cv, ov) in _views(x, cb, out):
        _columns(xv, cv.mT, ov, bounds, prefix=r == 0)
    return out


def apply_masked_t(dy: Tensor, cb: Tensor, native: bool = False) -> Tensor:
    """``dy @ cb`` per direction and group (the transposed map of :func:`apply_masked`;
    ``native`` as there)."""
    bounds = block_bounds(dy.shape[-1])
    if native_blocks(native, bounds, dy, cb):
        return native_cpu.column_products(dy, cb, bounds, transpose=False, prefix_first=False)
    if len(bounds) == 2:
        return torch.matmul(dy, cb)
    out = dy.new_empty(dy.shape)
    for r, (dv, cv, ov) in _views(dy, cb, out):
        _columns(dv, cv, ov, bounds, prefix=r == 1)
    return out


def masked_outer(dy: Tensor, x: Tensor, native: bool = False) -> Tensor:
    """``dy^T @ x`` (b, R, g, L, L) per direction and group, masked to each direction's strict
    triangle (the gradient of ``cb`` in :func:`apply_masked`; ``native`` as there,
    :func:`.native_cpu.masked_outer`)."""
    length = x.shape[-1]
    bounds = block_bounds(length)
    if native_blocks(native, bounds, dy, x):
        return native_cpu.masked_outer(dy, x, bounds)[0]
    if len(bounds) == 2:
        return mask_triangles(torch.matmul(dy.transpose(-1, -2), x))
    out = x.new_zeros(*x.shape[:3], length, length)
    for r, (dv, xv, ov) in _views(dy, x, out):
        for i0, i1 in zip(bounds, bounds[1:]):
            cols = slice(0, i1) if r == 0 else slice(i0, None)
            ov[:, i0:i1, cols] = torch.matmul(dv[..., i0:i1].transpose(-1, -2), xv[..., cols])
    return mask_triangles(out)


def mask_triangles(t: Tensor) -> Tensor:
    """Zero (in place) all but the strict lower triangle of direction 0 and the strict upper
    triangle of direction 1 of ``t`` (b, R, g, L, L), group by group: PyTorch's CPU ``tril_``
    and ``triu_`` work in place on a 3-d strided view, while a 4-d one such as ``t[:, 0]`` goes
    through a contiguous copy and back."""
    for gi in range(t.shape[2]):
        t[:, 0, gi].tril_(-1)
        if t.shape[1] == 2:
            t[:, 1, gi].triu_(1)
    return t
