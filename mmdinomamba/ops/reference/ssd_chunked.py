"""The chunked SSD scan in plain PyTorch (the reference for long sequences).

The sequence is cut into chunks of ``Q`` tokens (Mamba-2's block decomposition). Per chunk,
with ``a_t = dt_t A`` and the chunk-local cumulative sum ``s_t = a_1 + ... + a_t``:

* intra-chunk (diagonal block): ``y_i = sum_{j<=i} (C_i . B_j) exp(s_i - s_j) dt_j x_j + D x_i``;
* chunk state: ``S = sum_j exp(s_Q - s_j) dt_j B_j x_j^T``;
* states pass between chunks by ``H_k = exp(s_Q) H_{k-1} + S_k`` (a short loop over chunks
  on (n, p) states only);
* inter-chunk (off-diagonal blocks): ``y_i += exp(s_i) C_i H_{k-1}``.

What makes it fast and lean compared with the textbook ``ssd_minimal`` form:

* the work is cut into tiles of a few chunks (and a slice of the batch), so every temporary
  is small and stays in cache (large fresh allocations and memory passes dominate CPU time
  otherwise);
* no (chunks x chunks) segment-sum tensor, no 5-D einsums with large intermediates;
* ``C B^T`` is computed once per group and shared by the heads of the group; the state and
  inter-chunk products fold the heads of a group into one GEMM (``(n x Q) @ (Q x heads*p)``);
* when no chunk of a block decays over a range above ``FACTORED_RANGE`` (100), the diagonal
  blocks are factored too (``exp(s_i - s_j) = exp(s_i - m) exp(m - s_j)``, see
  :func:`~mmdinomamba.ops.ssd_chunked_blocks.factored_scales`): one GEMM per group for all its
  heads and no per-head (Q x Q) work; other blocks build their weights per head;
* decay exponents are clamped to ``[-60, 0]`` before ``exp`` (see
  :func:`~mmdinomamba.ops.ssd_chunked_blocks.exp_decay`);
* a custom autograd function saves only the inputs and the (n, p) state entering each chunk,
  and recomputes the rest tile by tile in a hand-written backward (``ssd_chunked_bwd.py``);
* a ragged last chunk is scanned at its own length (no padding to a multiple of ``Q``).

The result does not depend on the chunk size up to rounding; CPUs prefer small chunks:
:data:`PORTABLE_CHUNK_SIZE` (32) was 1.16x faster than 64 and 128 was slower still (forward +
backward, 24 heads of 64 channels, state 64, L = 1024 and 4096, one thread).

The native CPU kernel of the same algorithm is :mod:`mmdinomamba.ops.cpu.ssd_chunked`.
"""
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .ssd_chunked_blocks import (chunk_views, columns_as_heads, exp_decay, factored_intra,
                                 factored_scales, head_major, heads_as_columns,
                                 intra_chunk_weights)
from .ssd_chunked_bwd import backward_block

__all__ = ['ssd_scan_chunked', 'PORTABLE_CHUNK_SIZE']

#: Chunk length of the portable scan (see the module docstring).
PORTABLE_CHUNK_SIZE = 32
_TILE_ROWS = 1024  # (batch x tokens) rows per work unit


def _pass_states(S: Tensor, cdec: Tensor, state: Tensor | None, p: int):
    """States entering each chunk from per-chunk states ``S`` (b, g, c, n, r*p).

    ``cdec`` (b, c, g, r) is each chunk's total decay; ``state`` (b, g, n, r*p) enters the
    first chunk (None = zero). Returns the entering states (like ``S``) and the final state.
    """
    b, g, c, n, rp = S.shape
    dec = cdec.permute(0, 2, 1, 3).reshape(b, g, c, 1, rp // p, 1)
    S6 = S.view(b, g, c, n, rp // p, p)
    entering = torch.empty_like(S6)
    if state is None:
        entering[:, :, 0].zero_()
    else:
        entering[:, :, 0].copy_(state.view(b, g, n, -1, p))
    for k in range(c - 1):  # each state is written once, in place (no copy per chunk)
        torch.addcmul(S6[:, :, k], entering[:, :, k], dec[:, :, k], out=entering[:, :, k + 1])
    final = torch.addcmul(S6[:, :, -1], entering[:, :, -1], dec[:, :, -1])
    return entering.view(b, g, c, n, rp), final.view(b, g, n, rp)


def _fwd_block(x, dt, A, B, C, D, Q: int, state: Tensor | None, out: Tensor):
    """Forward of one block of full chunks; writes ``y`` into ``out`` (a (b, L, h, p) view).

    Returns the per-chunk entering states (b, g, c, n, r*p) and the final state (b, g, n, r*p).
    """
    xv, dtv, acs, Bg, Cg = chunk_views(x, dt, A, B, C, Q)
    b, c, _, g, r, p = xv.shape
    scales = factored_scales(dtv, A, acs)
    if scales is not None:
        y = factored_intra(xv, dtv, Bg, Cg, *scales)[0]
        if D is not None:
            y.addcmul_(xv, D.reshape(g, r, 1))
    else:  # a chunk decays too strongly to factor: per-head weights
        W = intra_chunk_weights(acs, dtv, Bg, Cg)[0]
        if D is not None:
            W.diagonal(dim1=-2, dim2=-1).add_(D.reshape(g, r, 1, 1))
        y = head_major(torch.matmul(W, head_major(xv)))  # (b, c, Q, g, r, p)
    coef = exp_decay(acs[:, :, -1:] - acs).mul_(dtv)
    # a contiguous B^T: CPU GEMMs with a transposed left operand this thin run ~1.3x slower
    S = torch.matmul(Bg.transpose(-1, -2).contiguous(), heads_as_columns(xv * coef[..., None]))
    entering, final = _pass_states(S, exp_decay(acs[:, :, -1].clone()), state, p)
    y_off = columns_as_heads(torch.matmul(Cg, entering), p)
    y_off.mul_(exp_decay(acs.clone())[..., None])
    out.view(xv.shape).copy_(y_off.add_(y))  # copy_, not out=: torch.compile-friendly
    return entering, final


def _tiles(batch: int, length: int, Q: int, tile: int) -> list[list[tuple]]:
    """Work units: per batch slice, its blocks ``(batch_slice, token_slice, chunk_len)`` in
    sequence order (tiles of full chunks, then the ragged rest). Batch slices keep about
    ``_TILE_ROWS`` token rows per unit, so temporaries stay cache-sized for any batch."""
    full = (length // Q) * Q
    blocks = [(slice(s, min(s + tile, full)), Q) for s in range(0, full, tile)]
    if full < length:
        blocks.append((slice(full, length), length - full))
    step = max(1, _TILE_ROWS // min(tile, length))
    return [[(slice(b, b + step), sl, q) for sl, q in blocks] for b in range(0, batch, step)]


class _ChunkedSSD(torch.autograd.Function):
    """Chunked SSD scan with a recomputing, hand-written backward."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, Q, tile):
        out = x.new_empty(x.shape)  # contiguous whatever x's strides (blocks are viewed)
        tiles = _tiles(x.shape[0], x.shape[1], Q, tile)
        keep = any(ctx.needs_input_grad)  # the per-chunk states are only kept for backward
        entering = []
        for row in tiles:
            state = None
            for bs, sl, q in row:
                ent, state = _fwd_block(x[bs, sl], dt[bs, sl], A, B[bs, sl], C[bs, sl], D, q, state,
                                        out[bs, sl])
                entering.append(ent if keep else None)
        ctx.save_for_backward(x, dt, A, B, C, D)
        ctx.tiles, ctx.entering = tiles, entering
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        with torch.autocast(device_type=dy.device.type, enabled=False):
            return _ChunkedSSD._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy):
        x, dt, A, B, C, D = ctx.saved_tensors
        dy = dy.contiguous()
        grads = dict(
            x=x.new_empty(x.shape),
            dt=dt.new_empty(dt.shape),
            B=B.new_empty(B.shape),
            C=C.new_empty(C.shape),
            A=torch.zeros_like(A),
            D=None if D is None else torch.zeros_like(D))
        entering = iter(reversed(ctx.entering))
        for row in reversed(ctx.tiles):
            dstate = None
            for bs, sl, q in reversed(row):
                dstate = backward_block(x[bs, sl], dt[bs, sl], A, B[bs, sl], C[bs, sl], D, q,
                                   next(entering), dy[bs, sl], dstate, grads, (bs, sl))
        return (grads['x'], grads['dt'], grads['A'], grads['B'], grads['C'], grads['D'], None, None)


def ssd_scan_chunked(x: Tensor,
                     dt: Tensor,
                     A: Tensor,
                     B: Tensor,
                     C: Tensor,
                     D: Tensor | None = None,
                     chunk_size: int = PORTABLE_CHUNK_SIZE,
                     tile_chunks: int = 4,
                     upcast: bool = True) -> Tensor:
    """Chunked SSD scan, exact to :func:`ssd_scan_ref` up to floating-point rounding.

    Works for any length, any floating dtype, with autograd (first order) for all inputs.

    Args:
        x (Tensor): (batch, length, heads, headdim).
        dt (Tensor): (batch, length, heads) positive step sizes.
        A (Tensor): (heads,) negative decay rates.
        B (Tensor): (batch, length, groups, state).
        C (Tensor): (batch, length, groups, state).
        D (Tensor, optional): (heads,) skip weights. Defaults to None.
        chunk_size (int): tokens per chunk. Defaults to :data:`PORTABLE_CHUNK_SIZE` (32, the
            fastest on CPU).
        tile_chunks (int): chunks processed together (cache blocking) by the PyTorch ops (the
            native kernels take one chunk at a time). Defaults to 4.
        upcast (bool): compute float16/bfloat16 inputs in float32 and cast the result back;
            False computes in the input dtype (a "plain PyTorch in bf16" baseline for kernel
            accuracy tests). Defaults to True.

    Returns:
        Tensor: (batch, length, heads, headdim), dtype of ``x``.
    """
    if chunk_size < 1 or tile_chunks < 1:
        raise ValueError(f'chunk_size and tile_chunks must be >= 1, got {chunk_size}, '
                         f'{tile_chunks}')
    out_dtype = x.dtype
    dtype = torch.float32 if upcast and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    x, dt, A, B, C = (t.to(dtype).contiguous() for t in (x, dt, A, B, C))
    D = None if D is None else D.to(dtype).contiguous()
    Q = max(1, min(chunk_size, x.shape[1]))
    # Under autocast the matmuls inside the Function would silently run in bf16/fp16 (and save
    # low-precision chunk states for backward): the scan computes in ``dtype`` only.
    with torch.autocast(device_type=x.device.type, enabled=False):
        out = _ChunkedSSD.apply(x, dt, A, B, C, D, Q, Q * tile_chunks)
    return out.to(out_dtype)
