"""The inside of a bidirectional Mamba-2 mixer on CPU, as one autograd function.

From the ``in_proj`` output ``[z, x, B, C, dt]`` to the input of ``out_proj`` (or, given its
weight, to its output): both directions' causal conv + SiLU (:mod:`.shift_conv`), both
directions' SSD scan in the quadratic form (:mod:`.ssd_quadratic`; heads of 16 channels with 16
states, with the native kernels, by their recurrence, :mod:`.ssd_recurrent`), each direction's
gated RMSNorm and their average.
Everything runs channel-major in the original token order (the backward direction is
anti-causal there), so nothing is flipped, concatenated or normalized twice, and the backward
pass is written by hand: it keeps the projection, the scan's product and small state, and
(with the native kernels) the conv's output, and recomputes the rest (the scan's per-head
matrices are cheaper to rebuild than to keep; the quadratic form's output is rebuilt tile by tile inside the merge's native backward
kernel; the recurrence keeps its output alone and recomputes its states; with ``out_proj``
inside, the merged output is rebuilt by the merge's backward pass).

Its specification is :func:`~mmdinomamba.ops.reference.bidir_mixer_ref`; the tests compare
outputs and every gradient. :mod:`.custom_ops` registers :func:`forward` and :func:`backward`
as the ``mmdinomamba::bidir_ssd`` op.
"""
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import record_function

from ..reference.mixer import InnerDims
from . import native_cpu
from .shift_conv import bidir_conv_backward, bidir_conv_forward, pad_channel_major
from .ssd_quadratic import FACTORED_RANGE, ScanState, scan_backward, scan_forward

__all__ = ['forward', 'backward', 'kept_layout', 'SLICE_FLOATS']

#: the most conv outputs (both directions) one batch slice of the CPU fast path works on at once
SLICE_FLOATS = 1 << 21


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
                   dims: InnerDims, native: bool, out: Tensor | None = None) -> tuple[Tensor, list]:
    """Mixed output (b, L, d) in the compute dtype (written into ``out`` if that has it) and
    what the backward pass needs (with ``native``, the conv's output too, which the backward
    pass recomputes otherwise; :func:`kept_layout`)."""
    ct = torch.promote_types(proj.dtype, torch.float32)
    with record_function('bidir_ssd.conv'):
        act = _conv(proj, conv_weight, conv_bias, dims, ct, native)[2]
    u, Bm, Cm = _split_conv(act, dims)
    if _use_recurrent(dims, native):  # the scan by its recurrence: keeps its output alone
        with record_function('bidir_ssd.scan'):
            dt = native_cpu.scan_steps(_tokens(proj[..., -dims.nheads:], ct), dt_bias.to(ct))
            y = native_cpu.recurrent_scan_forward(u, dt, A.to(ct), Bm, Cm, D.to(ct))
        out = _merged(proj, y, norm_weight, dims, ct, out, native)
        return out, [dt, y, act]
    with record_function('bidir_ssd.scan'):
        if native:  # dt and the scan's factors in one native pass
            dt, *factors = native_cpu.scan_factors(_tokens(proj[..., -dims.nheads:], ct),
                                                   dt_bias.to(ct), A.to(ct), FACTORED_RANGE)
        else:
            dt, factors = softplus(_dt(proj, dt_bias, dims, ct)), None
        y, st = scan_forward(u, dt, A.to(ct), Bm, Cm, D.to(ct), native, factors)
    out = _merged(proj, y, norm_weight, dims, ct, out, native)
    # keep the scan's (b, R, g, r p, L) product (the wide heads' parts in their slots, which
    # the product leaves unused) and its small state, and the conv's output or nothing of it
    # (recomputed): a layout fixed by the sizes, whatever the data
    if st.y_wide is not None:
        _store_wide(st.ys.view(u.shape), st.y_wide, st.wide)
    return out, [dt, st.S, st.row, st.col, st.wide, st.cb, st.cb_diag, st.diag, st.ys,
                 act if native else None]


def _store_wide(ys: Tensor, parts: Tensor, wide: Tensor) -> None:
    """Writes the wide heads' parts (N, p, L) (:func:`.ssd_quadratic_heads.add_saved`'s order)
    into their slots of ``ys`` (b, R, h, p, L), where the factored product is zero (their
    ``row`` and ``col`` scales are zero, so nothing reads those slots otherwise)."""
    start = 0
    for r in range(wide.shape[1]):
        count = int(wide[:, r].sum())
        ys[:, r][wide[:, r]] = parts[start:start + count]
        start += count


def _load_wide(ys: Tensor, wide: Tensor) -> Tensor | None:
    """The parts :func:`_store_wide` wrote (None when no head is wide)."""
    if not wide.any():
        return None
    return torch.cat([ys[:, r][wide[:, r]] for r in range(wide.shape[1])])


def _use_recurrent(dims: InnerDims, native: bool) -> bool:
    """Whether the native kernels scan by the recurrence (heads they take) instead of the
    quadratic form."""
    return native and native_cpu.recurrent_fits(dims.d_state, dims.headdim)


@record_function('bidir_ssd.merge')
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


def use_native(proj: Tensor, dims: InnerDims) -> bool:
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
    ct, (d, c) = dt.dtype, (dims.d_inner, dims.conv_dim)
    with record_function('bidir_ssd.conv'):
        xin, pre, act = _conv(proj, conv_weight, conv_bias, dims, ct, native, act)
    u, Bm, Cm = _split_conv(act, dims)
    st = st[0] if recurrent else ScanState(*st, _load_wide(st[-1].view(u.shape), st[3]))
    # the kernels write their parts of the gradient straight into it, in the compute dtype
    grad = dproj if dproj.dtype == ct else torch.empty(dproj.shape, dtype=ct)
    dm, z, dz = _tokens(dout, ct), _tokens(proj[..., :d], ct), grad[..., :d]
    with record_function('bidir_ssd.merge'):
        if recurrent:
            dy, dnorm = merge_backward(dm, st.flatten(2, 3), z, norm_weight, dims, dz, native,
                                       mixed)
        else:
            dy, dnorm = _merge_backward_of_scan(st, u, dm, z, norm_weight, dims, dz, native,
                                                mixed)
    dy = dy.unflatten(2, (-1, dims.headdim))
    with record_function('bidir_ssd.scan'):
        if recurrent:
            du, ddt, dA, dB, dC, dD = native_cpu.recurrent_scan_backward(dy, u, dt, A.to(ct), Bm,
                                                                          Cm, D.to(ct))
        else:
            du, ddt, dA, dB, dC, dD = scan_backward(dy, u, dt, A.to(ct), Bm, Cm, st, True,
                                                    native)
    with record_function('bidir_ssd.conv'):
        dweight, dbias = _conv_backward([du.flatten(2, 3), dB.flatten(2, 3), dC.flatten(2, 3)],
                                        xin, pre, conv_weight, conv_bias, grad[..., d:d + c])
    ddt_in = torch.ops.aten.softplus_backward(ddt, _dt(proj, dt_bias, dims, ct), 1.0, 20.0)
    grad[..., d + c:].copy_(ddt_in.sum(1).transpose(1, 2))
    if grad is not dproj:
        dproj.copy_(grad)
    return [dweight, dbias, ddt_in.sum((0, 3)), dA, dD, dnorm]


def _merge_backward_of_scan(st: ScanState, u: Tensor, dm: Tensor, z: Tensor,
                            weight: Tensor | None, dims: InnerDims, dz: Tensor, native: bool,
                            out: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """:func:`merge_backward` of the quadratic scan's output ``st.output(u)``: with the native
    kernels, rebuilt tile by tile inside the merge's kernel
    (:func:`.native_cpu.merge_backward_scan`), never written whole; else written first.
    ``st.y_wide`` is None exactly when no head is wide (:func:`.ssd_quadratic.scan_forward`)."""
    ys, outs = st.ys.view(u.shape), [] if out is None else [out]
    flat = [st.row, st.diag] + ([] if st.y_wide is None else [st.y_wide])
    if (native and weight is not None
            and native_cpu.tokens_fit(u.dtype, dm, z, dz, *outs)
            and native_cpu.fused_fit([ys, u], flat)):
        dy, dweight = native_cpu.merge_backward_scan(dm, ys, st.row, u, st.diag, st.wide,
                                                     st.y_wide, z, weight.to(u.dtype),
                                                     dims.ngroups, dims.eps, dz, out)
        return dy, dweight.to(weight.dtype)
    return merge_backward(dm, st.output(u, native).flatten(2, 3), z, weight, dims, dz, native,
                          out)


def _batch_slices(proj: Tensor, dims: InnerDims) -> list[slice]:
    """Near-equal batch slices of at most ``SLICE_FLOATS`` conv outputs each (one sample at
    least): they bound the (b, 2, C, L) temporaries, while every slice costs a pass of the
    whole function's small operations, so there are as few as the bound allows (the demo's
    step and DinoVim-T at 224 px with batch 8 run one slice; docs/results.md)."""
    batch, length = proj.shape[:2]
    per_sample = 2 * dims.conv_dim * length
    count = min(batch, max(1, -(-batch * per_sample // SLICE_FLOATS)))
    bounds = [round(i * batch / count) for i in range(count + 1)]
    return [slice(i, j) for i, j in zip(bounds, bounds[1:])]


def kept_layout(proj_shape, dims: InnerDims, native: bool) -> list[tuple]:
    """``(shape, dtype kind)`` of what :func:`forward` keeps, slice by slice (dtype kind:
    'ct' the compute dtype, 'f64', 'bool'; ``(0,)``: nothing kept), fixed by the sizes."""
    b_all, length = proj_shape[:2]
    h, p, g, n, c = dims.nheads, dims.headdim, dims.ngroups, dims.d_state, dims.conv_dim
    layout = []
    for sl in _batch_slices(torch.empty(proj_shape, device='meta'), dims):
        b = sl.stop - sl.start
        act = ((b, 2, c, length), 'ct') if native else ((0, ), 'ct')
        if _use_recurrent(dims, native):
            layout += [((b, 2, h, length), 'ct'), ((b, 2, h, p, length), 'ct'), act]
            continue
        plane = ((b, 2, h, length), 'ct')
        layout += [plane, ((b, 2, h, length), 'f64'), plane, plane, ((b, 2, h), 'bool'),
                   ((b, 2, g, length, length), 'ct'), ((b, 2, g, length), 'ct'), plane,
                   ((b, 2, g, h // g * p, length), 'ct'), act]
    return layout


def forward(proj: Tensor, params: list, out_weight: Tensor | None, out_bias: Tensor | None,
            dims: InnerDims, native: bool) -> tuple[Tensor, list]:
    """The mixed output (b, L, d) (or ``F.linear`` of it with ``out_weight``) in ``proj``'s
    dtype and what :func:`backward` needs (None where nothing is kept), batch slice by slice.
    ``params``: ``conv_weight, conv_bias, dt_bias, A, D, norm_weight`` of
    :func:`~mmdinomamba.ops.reference.bidir_mixer_ref`."""
    out = proj.new_empty(*proj.shape[:2], dims.d_inner)
    kept = []
    for sl in _batch_slices(proj, dims):
        target = out[sl]
        out_sl, kept_sl = _inner_forward(proj[sl], *params, dims, native, target)
        if out_sl is not target:  # computed in another dtype
            target.copy_(out_sl)
        kept += kept_sl
    return (out if out_weight is None else F.linear(out, out_weight, out_bias)), kept


def backward(dres: Tensor, proj: Tensor, params: list, out_weight: Tensor | None,
             with_out_bias: bool, kept: list, dims: InnerDims, native: bool) -> list:
    """Gradients of :func:`forward` for ``dres``: ``dproj``, those of ``params`` (None for a
    missing one) and of ``out_weight`` and its bias (None without them); the merged output is
    rebuilt, not kept."""
    slices = _batch_slices(proj, dims)
    per = len(kept) // len(slices)
    dproj, total = torch.empty_like(proj), None
    with torch.autocast(device_type=proj.device.type, enabled=False):
        dout, mixed = dres, None
        if out_weight is not None:  # through the output projection
            dout = torch.matmul(dres, out_weight)
            mixed = torch.empty(dout.shape, dtype=dout.dtype)  # proj's dtype (checked)
        for i, sl in enumerate(slices):
            grads = _inner_backward(dout[sl], proj[sl], params, kept[i * per:(i + 1) * per],
                                    dims, dproj[sl], native, None if mixed is None else mixed[sl])
            total = grads if total is None else [
                None if t is None else t + g for t, g in zip(total, grads)]
        dw_out = db_out = None
        if out_weight is not None:
            flat = dres.reshape(-1, dres.shape[-1])
            dw_out = flat.t().matmul(mixed.view(-1, mixed.shape[-1]))
            db_out = flat.sum(0) if with_out_bias else None
    return [dproj, *[None if g is None else g.to(p.dtype) for g, p in zip(total, params)],
            dw_out, db_out]


@native_cpu.register_self_check
def _native_self_check() -> str | None:
    """Small float32 forward and backward passes (conv, quadratic scan with factored and
    strongly decaying heads, merge; the recurrence for heads it takes) in the native kernels
    and in the PyTorch ops; returns what differs by more than ``native_cpu.SELF_CHECK_TOL``, or
    None. A compiler that builds the kernels wrongly (flags, a new CPU) then costs speed, not
    results. About a millisecond."""
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
            for native in (True, False):
                out, kept = _inner_forward(proj, *params, dims, native)
                dproj = torch.empty_like(proj)
                grads = _inner_backward(dout, proj, params, kept, dims, dproj, native)
                results.append([out, dproj, *grads])
        for name, got, want in zip(names, *results):
            err = ((got - want).norm() / want.norm()).item()
            if not err <= native_cpu.SELF_CHECK_TOL:  # NaN too
                return (f'bidirectional mixer {name}: relative error {err:.2e} against the '
                        f'PyTorch ops (heads of {size} channels)')
    return None
