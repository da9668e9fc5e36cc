"""The inside of a bidirectional Mamba-2 mixer on CPU, as one autograd function.

From the ``in_proj`` output ``[z, x, B, C, dt]`` to the input of ``out_proj`` (or, given its
weight, to its output): both directions' causal conv + SiLU (:mod:`.shift_conv`), both
directions' SSD scan in the quadratic form (:mod:`.ssd_quadratic`; heads of 16 channels with 16
states, with the native kernels, by their recurrence, :mod:`.ssd_recurrent`), each direction's
gated RMSNorm and their average.
Everything runs channel-major in the original token order (the backward direction is
anti-causal there), so nothing is flipped, concatenated or normalized twice, and the backward
pass is written by hand: it keeps the projection, the scan's product and small state, and
(with the native kernels, unless ``fast_path_variant(recompute_conv_cpu=True)``) the conv's
output, and recomputes the rest (the scan's per-head matrices are cheaper to rebuild than to
keep; the quadratic form's output is rebuilt tile by tile inside the merge's native backward
kernel; the recurrence keeps its output alone and recomputes its states; with ``out_proj``
inside, the merged output is rebuilt by the merge's backward pass).

The specification is the composition of :func:`~mmdinomamba.ops.bidir_causal_conv1d`,
:func:`~mmdinomamba.ops.ssd_scan` and :func:`~mmdinomamba.ops.bidir_gated_merge`
(``BiSSD(fast_path=False)``); the tests compare outputs and every gradient.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native_cpu
from .shift_conv import bidir_conv_backward, bidir_conv_forward, pad_channel_major
from .ssd_quadratic import FACTORED_RANGE, ScanState, scan_backward, scan_forward
from .variants import current_variant, fast_path_variant

__all__ = ['InnerDims', 'bidir_ssd_inner']

#: the most conv outputs (both directions) one batch slice of the CPU fast path works on at once
_SLICE_FLOATS = 1 << 21


@dataclass(frozen=True)
class InnerDims:
    """Sizes of a bidirectional mixer: ``d_inner``, ``ngroups``, ``d_state``, ``headdim``,
    the conv ``kernel`` and the RMSNorm ``eps``."""
    d_inner: int
    ngroups: int
    d_state: int
    headdim: int
    kernel: int
    eps: float = 1e-5

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim


def _channel_major(t: Tensor, dtype: torch.dtype, native: bool = False) -> Tensor:
    """(b, L, c) (any strides) -> contiguous (b, c, L) in ``dtype`` (``native``: the transposed
    copy in the native kernel, :func:`.native_cpu.transpose_into`)."""
    out = t.new_empty(t.shape[0], t.shape[2], t.shape[1], dtype=dtype)
    return native_cpu.transpose_into(out, t, native)


def _tokens(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A token-major (b, L, c) operand in ``dtype``: ``t`` itself (any strides) or a copy."""
    return t if t.dtype == dtype else t.to(dtype)


def softplus(x: Tensor) -> Tensor:
    """``F.softplus`` (beta 1, threshold 20) with ``log1p(u) = log(w) u / (w - 1)``, ``w = 1 +
    u`` (exact to rounding; CPU ``log1p`` kernels can be 20x slower than ``log``)."""
    u = torch.exp(x.clamp(max=20.))
    w = 1 + u
    d = w - 1
    out = torch.where(d == 0, u, torch.log(w).mul_(u / d))
    return torch.where(x > 20., x, out)


def _dt(proj: Tensor, dt_bias: Tensor, dims: InnerDims, dtype: torch.dtype) -> Tensor:
    """``dt + dt_bias`` (b, 2, h, L) of both directions before the softplus."""
    dt_raw = _channel_major(proj[..., dims.d_inner + dims.conv_dim:], dtype)
    return dt_raw.unsqueeze(1) + dt_bias.to(dtype)[..., None]


def _split_conv(act: Tensor, dims: InnerDims) -> tuple[Tensor, Tensor, Tensor]:
    """``u`` (b, 2, h, p, L), ``B`` and ``C`` (b, 2, g, n, L): views of the conv output."""
    d, gn = dims.d_inner, dims.ngroups * dims.d_state
    return (act[:, :, :d].unflatten(2, (-1, dims.headdim)),
            act[:, :, d:d + gn].unflatten(2, (dims.ngroups, -1)),
            act[:, :, d + gn:].unflatten(2, (dims.ngroups, -1)))


def _norms(y: Tensor, gate: Tensor, groups: int, eps: float) -> tuple[Tensor, Tensor]:
    """Gated RMSNorm of both directions without the weight: ``n`` (b, 2, g, d/g, L) and
    ``rstd`` (b, 2, g, 1, L)."""
    h = (y * gate.unsqueeze(1)).unflatten(2, (groups, -1))
    ms = (h * h).mean(-2, keepdim=True)
    rstd = ms.add_(eps).rsqrt_()
    return h.mul_(rstd), rstd


def _average_into(oc: Tensor, n: Tensor, half: Tensor) -> None:
    """``oc = n_f w_f / 2 + n_b w_b / 2``: the weighted average of both directions' normalized
    values ``n`` (b, 2, d, L) with the halved weights ``half`` (2, d), into the channel-major
    ``oc`` (b, d, L) (a transposed view of the token-major output)."""
    torch.mul(n[:, 0], half[0, :, None], out=oc)
    oc.addcmul_(n[:, 1], half[1, :, None])


def merge_forward(y: Tensor, z: Tensor, weight: Tensor | None, dims: InnerDims, out: Tensor,
                  native: bool = False) -> Tensor:
    """``(norm(y_f) w_f + norm(y_b) w_b) / 2`` (or ``(y_f + y_b) / 2 * gate`` without weight),
    ``gate = silu(z)``, of the channel-major ``y`` (b, 2, d, L) and the token-major ``z``
    (b, L, d) (e.g. a view into the projection), written into the token-major ``out`` (b, L, d)
    and returned; ``native``: the native CPU kernel (:mod:`.native_cpu`), which transposes tile
    by tile, where the operands suit it."""
    if weight is not None and native and native_cpu.tokens_fit(y.dtype, z, out):
        return native_cpu.merge_forward(y, z, weight.to(y.dtype), dims.ngroups, dims.eps, out)
    zc, oc = _channel_major(z, y.dtype, native), out.transpose(1, 2)
    if weight is None:
        torch.add(y[:, 0], y[:, 1], out=oc).mul_(F.silu(zc)).mul_(0.5)
        return out
    n = _norms(y, F.silu(zc), dims.ngroups, dims.eps)[0].flatten(2, 3)
    _average_into(oc, n, weight.to(y.dtype).mul(0.5))
    return out


def merge_backward(dm: Tensor, y: Tensor, z: Tensor, weight: Tensor | None, dims: InnerDims,
                   dz: Tensor, native: bool = False,
                   out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Gradients of :func:`merge_forward` for the token-major ``dm`` (b, L, d): writes ``dz``
    into the token-major ``dz`` (b, L, d) (e.g. a view into the projection's gradient) and
    returns ``dy`` (b, 2, d, L) and ``dweight`` (2, d) or None; with ``out`` (b, L, d) in
    ``y``'s dtype, also writes :func:`merge_forward`'s output into it again (the native kernel
    from the values the gradients use, in the same pass)."""
    outs = [] if out is None else [out]
    if weight is not None and native and native_cpu.tokens_fit(y.dtype, dm, z, dz, *outs):
        dy, dweight = native_cpu.merge_backward(dm, y, z, weight.to(y.dtype), dims.ngroups,
                                                dims.eps, dz, out)
        return dy, dweight.to(weight.dtype)
    dmc, zc = _channel_major(dm, y.dtype, native), _channel_major(z, y.dtype, native)
    gate = F.silu(zc)
    if weight is None:
        half = dmc * gate * 0.5
        ysum = y[:, 0] + y[:, 1]
        if out is not None:
            torch.mul(ysum, gate, out=out.transpose(1, 2)).mul_(0.5)
        dgate = ysum.mul_(dmc).mul_(0.5)
        native_cpu.transpose_into(dz, torch.ops.aten.silu_backward(dgate, zc), native)
        return half.unsqueeze(1).expand_as(y), None
    n, rstd = _norms(y, gate, dims.ngroups, dims.eps)
    nf, half_w = n.flatten(2, 3), weight.to(y.dtype).mul(0.5)
    if out is not None:
        _average_into(out.transpose(1, 2), nf, half_w)
    dweight = (nf * dmc.unsqueeze(1)).sum((0, 3)).mul_(0.5)
    dn = dmc.unsqueeze(1) * half_w[..., None]  # (b, 2, d, L)
    dng = dn.unflatten(2, (dims.ngroups, -1))
    mean = (dng * n).mean(-2, keepdim=True)
    dh = dng.addcmul_(n, mean, value=-1).mul_(rstd).flatten(2, 3)
    dgate = (dh * y).sum(1)
    native_cpu.transpose_into(dz, torch.ops.aten.silu_backward(dgate, zc), native)
    return dh.mul_(gate.unsqueeze(1)), dweight.to(weight.dtype)


def _inner_forward(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight,
                   dims: InnerDims, native: bool, out: Tensor | None = None,
                   keep_conv: bool = False) -> tuple[Tensor, list]:
    """Mixed output (b, L, d) in the compute dtype (written into ``out`` if that has it) and
    what the backward pass needs (``keep_conv``, with ``native``: the conv's output too, which
    the backward pass recomputes otherwise)."""
    ct = torch.promote_types(proj.dtype, torch.float32)
    act = _conv(proj, conv_weight, conv_bias, dims, ct, native)[2]
    u, Bm, Cm = _split_conv(act, dims)
    if _use_recurrent(dims, native):  # the scan by its recurrence: keeps its output alone
        dt = native_cpu.scan_steps(_tokens(proj[..., -dims.nheads:], ct), dt_bias.to(ct))
        y = native_cpu.recurrent_scan_forward(u, dt, A.to(ct), Bm, Cm, D.to(ct))
        out = _merged(proj, y, norm_weight, dims, ct, out, native)
        return out, [dt, y, act if keep_conv else None]
    if native:  # dt and the scan's factors in one native pass
        dt, *factors = native_cpu.scan_factors(_tokens(proj[..., -dims.nheads:], ct),
                                               dt_bias.to(ct), A.to(ct), FACTORED_RANGE)
    else:
        dt, factors = softplus(_dt(proj, dt_bias, dims, ct)), None
    y, st = scan_forward(u, dt, A.to(ct), Bm, Cm, D.to(ct), native, factors)
    out = _merged(proj, y, norm_weight, dims, ct, out, native)
    # keep the scan's (b, R, g, r p, L) product and its small state, and the conv's output
    # or nothing of it (recomputed)
    return out, [dt, st.S, st.row, st.col, st.wide, st.cb, st.cb_diag, st.diag, st.ys,
                 st.y_wide, act if keep_conv and native else None]


def _use_recurrent(dims: InnerDims, native: bool) -> bool:
    """Whether the native kernels scan by the recurrence (heads they take, and the variant's
    ``recurrent_scan``) instead of the quadratic form."""
    return (native and current_variant().recurrent_scan
            and native_cpu.recurrent_fits(dims.d_state, dims.headdim))


def _merged(proj: Tensor, y: Tensor, norm_weight: Tensor | None, dims: InnerDims,
            dtype: torch.dtype, out: Tensor | None, native: bool) -> Tensor:
    """The merge of the scan's output ``y`` (b, 2, h, p, L), written into ``out`` if that has
    ``dtype`` (else a new tensor) and returned."""
    if out is None or out.dtype != dtype:
        out = proj.new_empty(proj.shape[0], proj.shape[1], dims.d_inner, dtype=dtype)
    merge_forward(y.flatten(2, 3), _tokens(proj[..., :dims.d_inner], dtype), norm_weight, dims,
                  out, native)
    return out


def _conv(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dims: InnerDims,
          dtype: torch.dtype, native: bool,
          kept: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """The conv input, both directions' pre-activations (None from the native kernel, whose
    backward recomputes them) and their SiLU. The input is the padded channel-major ``xp`` of
    :func:`pad_channel_major` for the PyTorch ops, the token-major ``x`` part of the projection
    itself (or its copy in ``dtype``) for the native kernel, which transposes block by block;
    ``kept``: the native kernel's output as the forward pass kept it, returned instead of
    computed again."""
    xbc = proj[..., dims.d_inner:dims.d_inner + dims.conv_dim]
    weight, bias = conv_weight.to(dtype), None if conv_bias is None else conv_bias.to(dtype)
    if native:
        xbc = _tokens(xbc, dtype)
        return xbc, None, kept if kept is not None else native_cpu.conv_silu_forward(
            xbc, weight, bias)
    xp = pad_channel_major(xbc, dims.kernel, dtype)
    pre = bidir_conv_forward(xp, weight, bias)
    return xp, pre, F.silu(pre)


def _conv_backward(dparts: list[Tensor], x: Tensor, pre: Tensor | None, conv_weight: Tensor,
                   conv_bias: Tensor | None, dx: Tensor) -> tuple[Tensor, Tensor | None]:
    """Gradients of :func:`_conv`'s SiLU output for its input ``x``, from that output's gradient
    as its channel ranges ``dparts`` (b, 2, C_i, L) (``du``, ``dB``, ``dC``): writes the
    input's into the token-major ``dx`` (b, L, C) and returns ``dweight`` and ``dbias`` (or
    None)."""
    if pre is None:  # the native kernel reads the parts; dx is a view into the gradient
        return native_cpu.conv_silu_backward(
            dparts, x, conv_weight.to(x.dtype),
            None if conv_bias is None else conv_bias.to(x.dtype), dx)
    dact = torch.cat(dparts, dim=2)
    dxc, dweight, dbias = bidir_conv_backward(torch.ops.aten.silu_backward(dact, pre), x,
                                              conv_weight, conv_bias is not None)
    dx.copy_(dxc.transpose(1, 2))
    return dweight, dbias


def _use_native(proj: Tensor, dims: InnerDims) -> bool:
    """Whether this call runs the conv, the merge and the scan's strongly decaying heads in the
    native CPU kernels (:func:`.native_cpu.use_for`)."""
    return 2 <= dims.kernel <= 4 and native_cpu.use_for(proj)


def _inner_backward(dout: Tensor, proj: Tensor, params: list, kept: list, dims: InnerDims,
                    dproj: Tensor, native: bool, mixed: Tensor | None = None) -> list:
    """Gradients of one batch slice: writes ``dproj`` (like ``proj``) and returns those of the
    parameters ``conv_weight, conv_bias, dt_bias, A, D, norm_weight`` (float, or None);
    ``mixed`` (b, L, d) in the compute dtype: the forward pass's output written into it again
    (for the output projection's weight gradient)."""
    conv_weight, conv_bias, dt_bias, A, D, norm_weight = params
    dt, *st, act = kept
    recurrent = len(st) == 1  # the recurrence's output, or the quadratic form's state
    st = st[0] if recurrent else ScanState(*st)
    ct, (d, c) = dt.dtype, (dims.d_inner, dims.conv_dim)
    xin, pre, act = _conv(proj, conv_weight, conv_bias, dims, ct, native, act)
    u, Bm, Cm = _split_conv(act, dims)
    # the kernels write their parts of the gradient straight into it, in the compute dtype
    grad = dproj if dproj.dtype == ct else torch.empty(dproj.shape, dtype=ct)
    dm, z, dz = _tokens(dout, ct), _tokens(proj[..., :d], ct), grad[..., :d]
    if recurrent:
        dy, dnorm = merge_backward(dm, st.flatten(2, 3), z, norm_weight, dims, dz, native, mixed)
    else:
        dy, dnorm = _merge_backward_of_scan(st, u, dm, z, norm_weight, dims, dz, native, mixed)
    dy = dy.unflatten(2, (-1, dims.headdim))
    if recurrent:
        du, ddt, dA, dB, dC, dD = native_cpu.recurrent_scan_backward(dy, u, dt, A.to(ct), Bm, Cm,
                                                                      D.to(ct))
    else:
        du, ddt, dA, dB, dC, dD = scan_backward(dy, u, dt, A.to(ct), Bm, Cm, st, True, native)
    dweight, dbias = _conv_backward([du.flatten(2, 3), dB.flatten(2, 3), dC.flatten(2, 3)], xin,
                                    pre, conv_weight, conv_bias, grad[..., d:d + c])
    ddt_in = torch.ops.aten.softplus_backward(ddt, _dt(proj, dt_bias, dims, ct), 1.0, 20.0)
    grad[..., d + c:].copy_(ddt_in.sum(1).transpose(1, 2))
    if grad is not dproj:
        dproj.copy_(grad)
    return [dweight, dbias, ddt_in.sum((0, 3)), dA, dD, dnorm]


def _merge_backward_of_scan(st: ScanState, u: Tensor, dm: Tensor, z: Tensor,
                            weight: Tensor | None, dims: InnerDims, dz: Tensor, native: bool,
                            out: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`merge_backward` of the quadratic scan's output ``st.output(u)``: with the native
    kernels and the variant's ``fused_output``, rebuilt tile by tile inside the merge's kernel
    (:func:`.native_cpu.merge_backward_scan`), never written whole; else written first.
    ``st.y_wide`` is None exactly when no head is wide (:func:`.ssd_quadratic.scan_forward`)."""
    ys, outs = st.ys.view(u.shape), [] if out is None else [out]
    flat = [st.row, st.diag] + ([] if st.y_wide is None else [st.y_wide])
    if (native and weight is not None and current_variant().fused_output
            and native_cpu.tokens_fit(u.dtype, dm, z, dz, *outs)
            and native_cpu.fused_fit([ys, u], flat)):
        dy, dweight = native_cpu.merge_backward_scan(dm, ys, st.row, u, st.diag, st.wide,
                                                     st.y_wide, z, weight.to(u.dtype),
                                                     dims.ngroups, dims.eps, dz, out)
        return dy, dweight.to(weight.dtype)
    return merge_backward(dm, st.output(u, native).flatten(2, 3), z, weight, dims, dz, native,
                          out)


def _batch_slices(proj: Tensor, dims: InnerDims) -> list[slice]:
    """Near-equal batch slices of at most ``_SLICE_FLOATS`` conv outputs each (one sample at
    least): they bound the (b, 2, C, L) temporaries, while every slice costs a pass of the
    whole function's small operations, so there are as few as the bound allows (the demo's
    step and DinoVim-T at 224 px with batch 8 run one slice; docs/results.md)."""
    batch, length = proj.shape[:2]
    per_sample = 2 * dims.conv_dim * length
    count = min(batch, max(1, -(-batch * per_sample // _SLICE_FLOATS)))
    bounds = [round(i * batch / count) for i in range(count + 1)]
    return [slice(i, j) for i, j in zip(bounds, bounds[1:])]


class _BidirInner(torch.autograd.Function):
    """:func:`bidir_ssd_inner` with a hand-written backward pass, slice by slice of the batch."""

    @staticmethod
    def forward(ctx, proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight,
                out_bias, dims):
        params = [conv_weight, conv_bias, dt_bias, A, D, norm_weight]
        out = proj.new_empty(*proj.shape[:2], dims.d_inner)
        slices, kept = _batch_slices(proj, dims), []
        native = _use_native(proj, dims)
        keep_conv = not current_variant().recompute_conv_cpu
        for sl in slices:
            target = out[sl]
            out_sl, kept_sl = _inner_forward(proj[sl], *params, dims, native, target, keep_conv)
            if out_sl is not target:  # computed in another dtype
                target.copy_(out_sl)
            kept += kept_sl
        if any(ctx.needs_input_grad):  # not the mixed output: the backward pass rebuilds it
            ctx.save_for_backward(proj, *params, out_weight, *kept)
        ctx.dims, ctx.slices, ctx.native = dims, slices, native
        ctx.out_bias = out_bias is not None
        return out if out_weight is None else F.linear(out, out_weight, out_bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dres):
        saved = ctx.saved_tensors  # once: checkpointing unpacks each saved tensor only once
        proj, params, out_weight, kept = saved[0], saved[1:7], saved[7], saved[8:]
        per = len(kept) // len(ctx.slices)
        dproj, total = torch.empty_like(proj), None
        with torch.autocast(device_type=proj.device.type, enabled=False):
            dout, mixed = dres, None
            if out_weight is not None:  # through the output projection
                dout = torch.matmul(dres, out_weight)
                mixed = torch.empty(dout.shape, dtype=dout.dtype)  # proj's dtype (checked)
            for i, sl in enumerate(ctx.slices):
                grads = _inner_backward(dout[sl], proj[sl], params, kept[i * per:(i + 1) * per],
                                        ctx.dims, dproj[sl], ctx.native,
                                        None if mixed is None else mixed[sl])
                total = grads if total is None else [
                    None if t is None else t + g for t, g in zip(total, grads)]
            dw_out = db_out = None
            if out_weight is not None:
                flat = dres.reshape(-1, dres.shape[-1])
                dw_out = flat.t().matmul(mixed.view(-1, mixed.shape[-1]))
                db_out = flat.sum(0) if ctx.out_bias else None
        return (dproj, *[None if g is None else g.to(p.dtype) for g, p in zip(total, params)],
                dw_out, db_out, None)


@native_cpu.register_self_check
def _native_self_check() -> str | None:
    """Small float32 forward and backward passes of this fast path (conv, quadratic scan with
    factored and strongly decaying heads, merge; the recurrence for heads it takes) with the
    native kernels and with the PyTorch ops; returns what differs by more than
    ``native_cpu.SELF_CHECK_TOL``, or None. A compiler that builds the kernels wrongly (flags,
    a new CPU) then costs speed, not results. About a millisecond."""
    gen = torch.Generator().manual_seed(0)
    names = ['output', 'd proj', 'd conv weight', 'd conv bias', 'd dt_bias', 'd A', 'd D',
             'd norm weight']
    for size in (8, 16):  # the quadratic form; the recurrence
        dims = InnerDims(d_inner=4 * size, ngroups=2, d_state=size, headdim=size, kernel=4)
        b, length, h, c = 2, 40, dims.nheads, dims.conv_dim
        proj = torch.randn(b, length, dims.d_inner + c + h, generator=gen)  # [z, x, B, C, dt]
        params = [torch.randn(2, c, dims.kernel, generator=gen) / 2,
                  torch.randn(2, c, generator=gen) / 10,
                  # direction 0's first head decays ~50 per token: computed one by one
                  torch.tensor([[0., -3., -3., -3.], [-3., -3., -3., -3.]]),
                  -torch.tensor([[50., 1., 2., 4.], [1., 2., 4., 8.]]),
                  torch.randn(2, h, generator=gen),
                  1 + torch.randn(2, dims.d_inner, generator=gen)]
        dout = torch.randn(b, length, dims.d_inner, generator=gen)
        results = []
        # the first call may come from inside autocast: the check runs in float32 throughout
        with torch.no_grad(), torch.autocast('cpu', enabled=False):
            # the scan's fused kernels, and its separate calls
            for native, fused in ((True, True), (True, False), (False, False)):
                with fast_path_variant(fused_wide_heads=fused, fused_products=fused):
                    out, kept = _inner_forward(proj, *params, dims, native)
                    dproj = torch.empty_like(proj)
                    grads = _inner_backward(dout, proj, params, kept, dims, dproj, native)
                results.append([out, dproj, *grads])
        for variant, got_all in zip(('', ', the scan in separate calls'), results[:2]):
            for name, got, want in zip(names, got_all, results[2]):
                err = ((got - want).norm() / want.norm()).item()
                if not err <= native_cpu.SELF_CHECK_TOL:  # NaN too
                    return (f'{name}: relative error {err:.2e} against the PyTorch ops (heads '
                            f'of {size} channels{variant})')
    return None


def bidir_ssd_inner(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None,
                    dt_bias: Tensor, A: Tensor, D: Tensor, norm_weight: Tensor | None,
                    dims: InnerDims, out_weight: Tensor | None = None,
                    out_bias: Tensor | None = None) -> Tensor:
    """Both directions of a bidirectional Mamba-2 mixer between its two projections.

    With ``proj = [z, x, B, C, dt]`` (channel sizes ``d, d, g n, g n, h``), direction ``k``
    (0 forward, 1 backward) computes ``y_k = SSD_k(conv_k(x, B, C), softplus(dt + dt_bias[k]),
    A[k], D[k])`` (the backward direction on the reversed sequence) and the result is
    ``(rmsnorm(y_0 * silu(z)) * w[0] + rmsnorm(y_1 * silu(z)) * w[1]) / 2`` with the root mean
    square over groups of ``d / g`` channels (``norm_weight=None``:
    ``(y_0 + y_1) / 2 * silu(z)``), in the original token order.

    Args:
        proj (Tensor): (b, L, 2 d + 2 g n + h) ``in_proj`` output.
        conv_weight (Tensor): (2, d + 2 g n, K) filters of the two directions.
        conv_bias (Tensor | None): (2, d + 2 g n).
        dt_bias (Tensor): (2, h).
        A (Tensor): (2, h) negative decay rates.
        D (Tensor): (2, h) skip weights.
        norm_weight (Tensor | None): (2, d) RMSNorm scales, or None (no norm).
        dims (InnerDims): the mixer's sizes.
        out_weight (Tensor | None): (E, d) weight of the output projection applied to the
            result (``F.linear(result, out_weight, out_bias)``), or None (no projection). With
            it the backward pass rebuilds the result for the weight's gradient instead of
            keeping it (the native merge kernel writes it in the pass that computes the
            merge's gradients). Needs ``proj``'s dtype, float32 or float64.
        out_bias (Tensor | None): (E,) its bias, or None.

    Returns:
        Tensor: (b, L, d) in the dtype of ``proj`` (float16 / bfloat16 computed in float32), or
        (b, L, E) with ``out_weight``.
    """
    width = 2 * dims.d_inner + 2 * dims.ngroups * dims.d_state + dims.nheads
    if proj.dim() != 3 or proj.shape[-1] != width:
        raise ValueError(f'bidir_ssd_inner: proj must be (b, L, {width}), got '
                         f'{tuple(proj.shape)}')
    if out_weight is not None and (proj.dtype not in (torch.float32, torch.float64)
                                   or out_weight.dtype != proj.dtype or out_weight.dim() != 2
                                   or out_weight.shape[-1] != dims.d_inner):
        raise ValueError(f'bidir_ssd_inner: out_weight must be (E, {dims.d_inner}) in the dtype '
                         f'of proj (float32 or float64), got {tuple(out_weight.shape)} '
                         f'{out_weight.dtype} for proj {proj.dtype}')
    if out_bias is not None and out_weight is None:
        raise ValueError('bidir_ssd_inner: out_bias needs out_weight')
    with torch.autocast(device_type=proj.device.type, enabled=False):
        return _BidirInner.apply(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight,
                                 out_weight, out_bias, dims)
