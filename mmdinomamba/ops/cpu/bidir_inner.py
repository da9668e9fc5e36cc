"""The inside of a bidirectional Mamba-2 mixer on CPU, as one autograd function.

From the ``in_proj`` output ``[z, x, B, C, dt]`` to the input of ``out_proj`` (or, given its
weight, to its output): both directions' causal conv + SiLU, both directions' SSD scan in the
quadratic form (:mod:`.ssd_quadratic`), each direction's gated RMSNorm and their average, all
in the native kernels (:mod:`.native_cpu`), one path. Everything runs channel-major in the
original token order (the backward direction is anti-causal there), so nothing is flipped,
concatenated or normalized twice, and the backward pass is written by hand: it keeps the
projection, the conv's output, the scan's product and small state, and recomputes the rest (the
scan's per-head matrices are cheaper to rebuild than to keep; the quadratic form's output is
rebuilt tile by tile inside the merge's backward kernel; with ``out_proj`` inside, the merged
output is rebuilt by the merge's backward pass).

Its specification is :func:`~mmdinomamba.ops.reference.bidir_mixer_ref` (with a norm weight);
the tests and the self-check compare outputs and every gradient. :mod:`.custom_ops` registers
:func:`forward` and :func:`backward` as the ``mmdinomamba::bidir_ssd`` op.
"""
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import record_function

from ..reference.mixer import InnerDims
from ..self_check import mismatch, reference_graph
from . import native_cpu
from .native_cpu import kernels
from .ssd_quadratic import FACTORED_RANGE, ScanState, scan_backward, scan_forward

__all__ = ['forward', 'backward', 'kept_layout', 'SLICE_FLOATS']

#: the most conv outputs (both directions) one batch slice of the CPU fast path works on at once
SLICE_FLOATS = 1 << 21


def _tokens(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A token-major (b, L, c) operand in ``dtype``: ``t`` itself (a view into the projection)
    or a copy."""
    return t if t.dtype == dtype else t.to(dtype)


def _split_conv(act: Tensor, dims: InnerDims) -> tuple[Tensor, Tensor, Tensor]:
    """``u`` (b, 2, h, p, L), ``B`` and ``C`` (b, 2, g, n, L): views of the conv output."""
    d, gn = dims.d_inner, dims.ngroups * dims.d_state
    return (act[:, :, :d].unflatten(2, (-1, dims.headdim)),
            act[:, :, d:d + gn].unflatten(2, (dims.ngroups, -1)),
            act[:, :, d + gn:].unflatten(2, (dims.ngroups, -1)))


def _inner_forward(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight,
                   dims: InnerDims, out: Tensor | None = None) -> tuple[Tensor, list]:
    """Mixed output (b, L, d) in the compute dtype (written into ``out`` if that has it) and
    what the backward pass needs (:func:`kept_layout`)."""
    ct = torch.promote_types(proj.dtype, torch.float32)
    with record_function('bidir_ssd.conv'):
        act = kernels().conv_silu_forward(*_conv_inputs(proj, conv_weight, conv_bias, dims, ct))
    u, Bm, Cm = _split_conv(act, dims)
    raw = _tokens(proj[..., -dims.nheads:], ct)
    with record_function('bidir_ssd.scan'):
        # dt and the scan's factors in one pass
        dt, *factors = kernels().scan_factors(raw, dt_bias.to(ct), A.to(ct), FACTORED_RANGE)
        y, st = scan_forward(u, dt, A.to(ct), Bm, Cm, D.to(ct), factors)
    with record_function('bidir_ssd.merge'):
        if out is None or out.dtype != ct:
            out = proj.new_empty(proj.shape[0], proj.shape[1], dims.d_inner, dtype=ct)
        kernels().merge_forward(y.flatten(2, 3), _tokens(proj[..., :dims.d_inner], ct),
                                norm_weight.to(ct), dims.ngroups, dims.eps, out)
    # keep the scan's (b, R, g, r p, L) product (the wide heads' parts in their slots, which
    # the product leaves unused) and its small state, and the conv's output: a layout fixed by
    # the sizes, whatever the data
    if st.y_wide is not None:
        _store_wide(st.ys.view(u.shape), st.y_wide, st.wide)
    return out, [dt, st.S, st.row, st.col, st.wide, st.cb, st.cb_diag, st.diag, st.ys, act]


def _store_wide(ys: Tensor, parts: Tensor, wide: Tensor) -> None:
    """Writes the wide heads' parts (N, p, L) (the kernel ``wide_forward``'s order)
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


def _conv_inputs(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dims: InnerDims,
                 dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor | None]:
    """The conv's token-major input (the ``x`` part of the projection itself, or its copy in
    ``dtype``; the kernel transposes block by block), weight and bias in ``dtype``."""
    xbc = _tokens(proj[..., dims.d_inner:dims.d_inner + dims.conv_dim], dtype)
    return xbc, conv_weight.to(dtype), None if conv_bias is None else conv_bias.to(dtype)


def _inner_backward(dout: Tensor, proj: Tensor, params: list, kept: list, dims: InnerDims,
                    dproj: Tensor, mixed: Tensor | None = None) -> list:
    """Gradients of one batch slice: writes ``dproj`` (like ``proj``) and returns those of the
    parameters ``conv_weight, conv_bias, dt_bias, A, D, norm_weight`` (float, or None);
    ``mixed`` (b, L, d) in the compute dtype: the forward pass's output written into it again
    (for the output projection's weight gradient)."""
    conv_weight, conv_bias, dt_bias, A, D, norm_weight = params
    dt, *st, act = kept
    ct, (d, c) = dt.dtype, (dims.d_inner, dims.conv_dim)
    u, Bm, Cm = _split_conv(act, dims)
    st = ScanState(*st, _load_wide(st[-1].view(u.shape), st[3]))
    # the kernels write their parts of the gradient straight into it, in the compute dtype
    grad = dproj if dproj.dtype == ct else torch.empty(dproj.shape, dtype=ct)
    dm, z, dz = _tokens(dout, ct), _tokens(proj[..., :d], ct), grad[..., :d]
    weight = norm_weight.to(ct)
    with record_function('bidir_ssd.merge'):  # the scan's output rebuilt tile by tile inside
        dy, dnorm = kernels().merge_backward_scan(  # the kernel, never written whole
            dm, st.ys.view(u.shape), st.row, u, st.diag, st.wide, st.y_wide, z, weight,
            dims.ngroups, dims.eps, dz, mixed)
    dy = dy.unflatten(2, (-1, dims.headdim))
    with record_function('bidir_ssd.scan'):
        du, ddt, dA, dB, dC, dD = scan_backward(dy, u, dt, A.to(ct), Bm, Cm, st, True)
    with record_function('bidir_ssd.conv'):  # the kernel reads the parts; dx: a view of grad
        dweight, *dbias = kernels().conv_silu_backward(
            [du.flatten(2, 3), dB.flatten(2, 3), dC.flatten(2, 3)],
            *_conv_inputs(proj, conv_weight, conv_bias, dims, ct), grad[..., d:d + c])
    dt_in = proj[..., d + c:].transpose(1, 2).to(ct).unsqueeze(1) + dt_bias.to(ct)[..., None]
    ddt_in = torch.ops.aten.softplus_backward(ddt, dt_in, 1.0, 20.0)
    grad[..., d + c:].copy_(ddt_in.sum(1).transpose(1, 2))
    if grad is not dproj:
        dproj.copy_(grad)
    return [dweight, dbias[0] if dbias else None, ddt_in.sum((0, 3)), dA, dD, dnorm]


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


def kept_layout(proj_shape, dims: InnerDims) -> list[tuple]:
    """``(shape, dtype kind)`` of what :func:`forward` keeps, slice by slice (dtype kind:
    'ct' the compute dtype, 'f64', 'bool'), fixed by the sizes."""
    length = proj_shape[1]
    h, p, g, c = dims.nheads, dims.headdim, dims.ngroups, dims.conv_dim
    layout = []
    for sl in _batch_slices(torch.empty(proj_shape, device='meta'), dims):
        b = sl.stop - sl.start
        plane, act = ((b, 2, h, length), 'ct'), ((b, 2, c, length), 'ct')
        layout += [plane, ((b, 2, h, length), 'f64'), plane, plane, ((b, 2, h), 'bool'),
                   ((b, 2, g, length, length), 'ct'), ((b, 2, g, length), 'ct'), plane,
                   ((b, 2, g, h // g * p, length), 'ct'), act]
    return layout


def forward(proj: Tensor, params: list, out_weight: Tensor | None, out_bias: Tensor | None,
            dims: InnerDims) -> tuple[Tensor, list]:
    """The mixed output (b, L, d) (or ``F.linear`` of it with ``out_weight``) in ``proj``'s
    dtype and what :func:`backward` needs, batch slice by slice. ``params``: ``conv_weight,
    conv_bias, dt_bias, A, D, norm_weight`` of :func:`~mmdinomamba.ops.reference.bidir_mixer_ref`
    (``conv_bias`` may be None, ``norm_weight`` not)."""
    proj = proj.contiguous()  # the kernels read its parts as token-major views
    out = proj.new_empty(*proj.shape[:2], dims.d_inner)
    kept = []
    for sl in _batch_slices(proj, dims):
        target = out[sl]
        out_sl, kept_sl = _inner_forward(proj[sl], *params, dims, target)
        if out_sl is not target:  # computed in another dtype
            target.copy_(out_sl)
        kept += kept_sl
    return (out if out_weight is None else F.linear(out, out_weight, out_bias)), kept


def backward(dres: Tensor, proj: Tensor, params: list, out_weight: Tensor | None,
             with_out_bias: bool, kept: list, dims: InnerDims) -> list:
    """Gradients of :func:`forward` for ``dres``: ``dproj`` (contiguous), those of ``params``
    (None for a missing one) and of ``out_weight`` and its bias (None without them); the merged
    output is rebuilt, not kept."""
    proj, dres = proj.contiguous(), dres.contiguous()
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
                                    dims, dproj[sl], None if mixed is None else mixed[sl])
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
    """Small forward and backward passes (conv, quadratic scan with factored and strongly
    decaying heads, merge) in the native kernels, in float32 and float64, against the float64
    reference (:func:`~mmdinomamba.ops.reference.bidir_mixer_ref` with the scan ``y = M x`` of
    the mixing matrices, and autograd); returns what differs by more than
    ``native_cpu.SELF_CHECK_TOL``, or None. A compiler that builds the kernels wrongly (flags, a
    new CPU) then costs speed, not results. About 50 ms on two cores, once per process."""
    from ..reference import bidir_mixer_ref, ssd_scan_quadratic_ref
    gen = torch.Generator().manual_seed(0)
    names = ['output', 'd proj', 'd conv weight', 'd conv bias', 'd dt_bias', 'd A', 'd D',
             'd norm weight']
    dims = InnerDims(d_inner=32, ngroups=2, d_state=8, headdim=8, kernel=4)
    b, length, h, c = 2, 40, dims.nheads, dims.conv_dim
    proj = torch.randn(b, length, dims.d_inner + c + h, generator=gen, dtype=torch.float64)
    params = [torch.randn(2, c, dims.kernel, generator=gen, dtype=torch.float64) / 2,
              torch.randn(2, c, generator=gen, dtype=torch.float64) / 10,
              # direction 0's first head decays ~50 per token: computed one by one
              torch.tensor([[0., -3., -3., -3.], [-3., -3., -3., -3.]], dtype=torch.float64),
              -torch.tensor([[50., 1., 2., 4.], [1., 2., 4., 8.]], dtype=torch.float64),
              torch.randn(2, h, generator=gen, dtype=torch.float64),
              1 + torch.randn(2, dims.d_inner, generator=gen, dtype=torch.float64)]
    dout = torch.randn(b, length, dims.d_inner, generator=gen, dtype=torch.float64)
    with reference_graph():
        leaves = [t.clone().requires_grad_() for t in (proj, *params)]
        out = bidir_mixer_ref(*leaves, dims, ssd_scan_quadratic_ref)
        want = [out.detach(), *torch.autograd.grad(out, leaves, dout)]
    with torch.no_grad(), torch.autocast('cpu', enabled=False):
        for dtype in (torch.float32, torch.float64):
            ins = [t.to(dtype) for t in (proj, *params, dout)]
            out, kept = forward(ins[0], ins[1:7], None, None, dims)
            got = [out, *backward(ins[7], ins[0], ins[1:7], None, False, kept, dims)[:7]]
            error = mismatch(names, got, want, native_cpu.SELF_CHECK_TOL)
            if error is not None:
                return f'bidirectional mixer {error} against the reference ({dtype})'
    return None
