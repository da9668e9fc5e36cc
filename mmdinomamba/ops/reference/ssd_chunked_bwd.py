"""Hand-written backward of the chunked SSD scan (see ``ssd_chunked.py`` for the forward).

Per block of ``c`` chunks, the forward quantities are recomputed from the inputs and the
saved states entering each chunk, then differentiated term by term (notation of
``ssd_chunked.py``; ``s`` the chunk-local cumulative sum of ``a = dt A``, ``H`` the entering
state, ``W_ij = (C_i . B_j) exp(s_i - s_j) dt_j``):

* intra: ``dx += W^T dy``, ``dW = dy x^T``, ``ddt_j += sum_i dW_ij W_ij / dt_j``,
  ``d(C B^T) = sum_heads dW * exp(s_i - s_j) dt_j`` gives ``dC``, ``dB``; with
  ``G = dW * W``, ``da_k += sum_{j < k <= i} G_ij`` (the pairs whose decay contains ``a_k``);
* inter: ``y_i += exp(s_i) C_i H`` gives ``dC``, ``dH`` and ``ds_i`` (then
  ``da_k += sum_{i >= k} ds_i``);
* states: ``H_out = exp(s_Q) H + S`` is reversed chunk by chunk (``dS = dH_out``), and
  ``S = sum_j exp(s_Q - s_j) dt_j B_j x_j^T`` gives ``dx``, ``dB``, ``ddt`` and ``da``;
* finally ``ddt += da A`` and ``dA = sum(da dt)``.

Summing the pair terms directly (instead of ``d s_i = rowsum_i(G) - colsum_i(G)`` followed by a
reverse cumulative sum) avoids cancelling large near-diagonal terms: ``dA`` and ``ddt`` keep
float32 accuracy for strong decays.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from .ssd_chunked_blocks import (chunk_views, columns_as_heads, exp_decay, factored_intra,
                                 factored_scales, head_major, heads_as_columns,
                                 intra_chunk_weights)

__all__ = ['backward_block']


def _to_tok_order(t: Tensor) -> Tensor:
    """(b, g, r, c, Q) -> (b, c, Q, g, r) (a view)."""
    return t.permute(0, 3, 4, 1, 2)


def _bwd_intra(xv, dyv, acs, dtv, Bg, Cg):
    """Gradients of the diagonal blocks. Returns dx (b, c, Q, g, r, p), da and ddt
    (b, c, Q, g, r), dB and dC (b, g, c, Q, n), and dD (h,) (``sum_i dy_i . x_i``)."""
    W, E, cb = intra_chunk_weights(acs, dtv, Bg, Cg)
    dy_h, x_h = head_major(dyv).contiguous(), head_major(xv).contiguous()
    dx = head_major(torch.matmul(W.transpose(-1, -2), dy_h))
    V = torch.matmul(dy_h, x_h.transpose(-1, -2))  # dW
    dD = V.diagonal(dim1=-2, dim2=-1).sum(dim=(0, 3, 4)).reshape(-1)
    V.mul_(E)  # dW * E
    G = V * dtv.permute(0, 3, 4, 1, 2).unsqueeze(-2)  # dW * E * dt_j
    dcb = G.sum(dim=2).tril_()  # (b, g, c, Q, Q)
    G.mul_(cb.unsqueeze(2))  # dW * W
    # da_k = sum over pairs j < k <= i of G_ij (the pairs whose decay contains a_k); summing
    # the pairs directly avoids cancelling large near-diagonal terms (rowsum - colsum).
    straddle = G.cumsum(dim=-1).tril_(-1).sum(dim=-2)  # [m] = sum_{i > m >= j} G_ij
    da = _to_tok_order(F.pad(straddle[..., :-1], (1, 0)))
    ddt = _to_tok_order(V.mul_(cb.unsqueeze(2)).sum(dim=-2))
    dC = torch.matmul(dcb, Bg)
    dB = torch.matmul(dcb.transpose(-1, -2), Cg)
    return dx, da, ddt, dB, dC, dD


def _bwd_intra_factored(xv, dyv, dtv, Bg, Cg, row, col):
    """Gradients of the diagonal blocks in the factored form
    (:func:`~mmdinomamba.ops.ssd_chunked_blocks.factored_intra`). Returns dx, ds (gradient
    w.r.t. the cumulative sums ``s``, through ``row`` and ``col``), ddt (b, c, Q, g, r), dB,
    dC (b, g, c, Q, n) and dD (h,)."""
    p = xv.shape[-1]
    y, cb, xs = factored_intra(xv, dtv, Bg, Cg, row, col)  # y: row * (cb @ xs)
    dys = heads_as_columns(dyv * row[..., None])
    dxs = columns_as_heads(torch.matmul(cb.transpose(-1, -2), dys), p)
    dcb = torch.matmul(dys, xs.transpose(-1, -2)).tril_()
    dC = torch.matmul(dcb, Bg)
    dB = torch.matmul(dcb.transpose(-1, -2), Cg)
    t = (dxs * xv).sum(dim=-1)  # through xs = x dt col
    ddt = t * col
    # s_i enters y_i through row_i (+) and x_i through col_i (-)
    ds = (dyv * y).sum(dim=-1).sub_(ddt * dtv)
    dD = (dyv * xv).sum(dim=(0, 1, 2, 5)).reshape(-1)
    return dxs.mul_((dtv * col)[..., None]), ds, ddt, dB, dC, dD


def _reverse_states(dH_local: Tensor, cdec: Tensor, dstate: Tensor | None, entering: Tensor,
                    p: int):
    """Gradients w.r.t. the state leaving each chunk (= dS), w.r.t. each chunk's decay and
    w.r.t. the block's input state.

    ``dH_local`` (b, g, c, n, r*p) is the gradient w.r.t. each chunk's entering state through
    its own outputs; ``cdec`` (b, c, g, r) the chunk decays; ``dstate`` (b, g, n, r*p) the
    gradient w.r.t. the block's final state (None = zero); ``entering`` (like ``dH_local``) the
    states entering the chunks.

    Returns:
        tuple: ``dS`` (like ``dH_local``), ``ds_last`` (b, c, g, r) the gradient w.r.t. each
        chunk's total log-decay ``s_Q`` through the state it passes on, and the gradient w.r.t.
        the block's input state (b, g, n, r*p).
    """
    b, g, c, n, rp = dH_local.shape
    dec = cdec.permute(0, 2, 1, 3).reshape(b, g, c, 1, rp // p, 1)
    local = dH_local.view(b, g, c, n, rp // p, p)
    ent = entering.view(local.shape)
    dS = torch.empty_like(local)
    ds_last = cdec.new_empty(cdec.shape)
    scratch = local.new_empty(b, g, n, rp // p, p)
    if dstate is None:
        dS[:, :, -1].zero_()
    else:
        dS[:, :, -1].copy_(dstate.view(b, g, n, -1, p))
    for k in range(c - 1, -1, -1):  # each gradient is written once, in place
        # H_out = exp(s_Q) H_in + S: sum(dH_out * H_in), while dS[k] is still in cache
        ds_last[:, k] = torch.mul(ent[:, :, k], dS[:, :, k], out=scratch).sum(dim=(2, 4))
        if k:
            torch.addcmul(local[:, :, k], dS[:, :, k], dec[:, :, k], out=dS[:, :, k - 1])
    dstate_in = torch.addcmul(local[:, :, 0], dS[:, :, 0], dec[:, :, 0])
    return dS.view(b, g, c, n, rp), ds_last.mul_(cdec), dstate_in.view(b, g, n, rp)


def _bwd_inter(xv, dyv, acs, dtv, Bg, Cg, entering, dstate):
    """Gradients of the inter-chunk terms.

    Returns dx, ds (gradient w.r.t. the cumulative sums ``s``), da_state (gradient w.r.t.
    ``a`` from the state terms), ddt, dB, dC and dstate_in.
    """
    p = xv.shape[-1]
    dy_s = heads_as_columns(dyv * exp_decay(acs.clone())[..., None])  # (b, g, c, Q, r*p)
    dC = torch.matmul(dy_s, entering.transpose(-1, -2))
    ds = (columns_as_heads(torch.matmul(Cg, entering), p) * columns_as_heads(dy_s, p)).sum(dim=-1)
    cdec = exp_decay(acs[:, :, -1].clone())  # (b, c, g, r)
    dS, ds_last, dstate_in = _reverse_states(
        torch.matmul(Cg.transpose(-1, -2).contiguous(), dy_s), cdec, dstate, entering, p)

    to_end = exp_decay(acs[:, :, -1:] - acs)  # (b, c, Q, g, r)
    coef = to_end * dtv
    BdS = columns_as_heads(torch.matmul(Bg, dS), p)  # (b, c, Q, g, r, p)
    dscalar = (BdS * xv).sum(dim=-1)
    ddt = to_end.mul_(dscalar)
    # exp(s_Q - s_j) contains a_k for k > j; exp(s_Q) (chunk decay) contains every a_k.
    cd = (coef * dscalar).cumsum(dim=2)
    da_state = F.pad(cd[:, :, :-1], (0, 0, 0, 0, 1, 0)).add_(ds_last.unsqueeze(2))
    dB = torch.matmul(heads_as_columns(xv * coef[..., None]), dS.transpose(-1, -2))
    dx = BdS.mul_(coef[..., None])
    return dx, ds, da_state, ddt, dB, dC, dstate_in


def backward_block(x, dt, A, B, C, D, Q: int, entering: Tensor, dy: Tensor, dstate: Tensor | None,
              grads: dict, index: tuple) -> Tensor:
    """Backward of one forward block; writes the block's gradients into ``grads``.

    Args:
        x, dt, A, B, C, D: the block's inputs (as in ``ssd_scan_chunked``).
        Q (int): chunk length of this block.
        entering (Tensor): (b, g, c, n, r*p) states entering each chunk (saved by forward).
        dy (Tensor): (b, c*Q, h, p) gradient of the block's outputs.
        dstate (Tensor | None): gradient w.r.t. the block's final state (None = zero).
        grads (dict): full-size gradient buffers ``x, dt, B, C`` (written at ``index``) and
            accumulators ``A``, ``D``.
        index (tuple): the block's (batch slice, token slice).

    Returns:
        Tensor: (b, g, n, r*p) gradient w.r.t. the state entering the block.
    """
    xv, dtv, acs, Bg, Cg = chunk_views(x, dt, A, B, C, Q)
    dyv = dy.reshape(xv.shape)
    scales = factored_scales(dtv, A, acs)  # the forward's choice, from the same inputs
    if scales is not None:
        dx1, ds1, ddt1, dB1, dC1, dD = _bwd_intra_factored(xv, dyv, dtv, Bg, Cg, *scales)
    else:
        dx1, da1, ddt1, dB1, dC1, dD = _bwd_intra(xv, dyv, acs, dtv, Bg, Cg)
    dx2, ds2, da2, ddt2, dB2, dC2, dstate_in = _bwd_inter(xv, dyv, acs, dtv, Bg, Cg, entering,
                                                          dstate)
    if scales is not None:  # s_i = sum_{k<=i} a_k; summed in float64 (the row and col terms
        # of the factored form cancel in part)
        da = ds2.double().add_(ds1).flip(2).cumsum(dim=2).flip(2).to(ds2.dtype).add_(da2)
    else:
        da = ds2.flip(2).cumsum(dim=2).flip(2).add_(da1).add_(da2)
    g, r = xv.shape[3:5]
    grads['A'] += (da * dtv).sum(dim=(0, 1, 2)).reshape(-1)
    ddt = torch.add(ddt1, ddt2).add_(da * A.reshape(g, r))
    dx = torch.add(dx1, dx2, out=grads['x'][index].view(xv.shape))  # no copy afterwards
    if D is not None:
        dx.addcmul_(dyv, D.reshape(g, r, 1))
        grads['D'] += dD
    grads['dt'][index].view(dtv.shape).copy_(ddt)
    for key, val in (('B', dB1.add_(dB2)), ('C', dC1.add_(dC2))):
        grads[key][index].view(xv.shape[:4] + val.shape[-1:]).copy_(val.permute(0, 2, 3, 1, 4))
    return dstate_in
