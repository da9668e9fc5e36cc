"""``mmdinomamba::bidir_ssd``: the bidirectional mixer between its projections as one
``torch.library`` op with a CPU kernel, a fake implementation and registered autograd.

``torch.compile`` sees one node (no graph break), ``torch.library.opcheck`` tests it, and the
profiler shows it by name. The forward op returns the mixed output and what its backward op
needs (:func:`.bidir_inner.kept_layout`); the backward op returns every gradient (empty tensors
stand for missing ones, e.g. a missing conv bias).
"""
import torch
from torch import Tensor

from ..reference.mixer import InnerDims
from . import bidir_inner

__all__ = ['bidir_ssd_op']

_EMPTY = (0, )


def _dims(d_inner, ngroups, d_state, headdim, kernel, eps) -> InnerDims:
    return InnerDims(d_inner, ngroups, d_state, headdim, kernel, eps)


def _none(t: Tensor) -> Tensor | None:
    return None if t.numel() == 0 else t


@torch.library.custom_op('mmdinomamba::bidir_ssd', mutates_args=(), device_types='cpu')
def _bidir_ssd(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt_bias: Tensor,
               A: Tensor, D: Tensor, norm_weight: Tensor, out_weight: Tensor | None,
               out_bias: Tensor | None, d_inner: int, ngroups: int, d_state: int, headdim: int,
               kernel: int, eps: float) -> tuple[Tensor, list[Tensor]]:
    dims = _dims(d_inner, ngroups, d_state, headdim, kernel, eps)
    with torch.profiler.record_function('bidir_ssd.forward'):
        params = [conv_weight, conv_bias, dt_bias, A, D, norm_weight]
        return bidir_inner.forward(proj, params, out_weight, out_bias, dims)


def _layout(proj: Tensor, dims: InnerDims) -> list[Tensor]:
    """Empty tensors shaped as :func:`.bidir_inner.kept_layout` says."""
    kinds = dict(ct=torch.promote_types(proj.dtype, torch.float32), f64=torch.float64,
                 bool=torch.bool)
    return [proj.new_empty(shape, dtype=kinds[kind])
            for shape, kind in bidir_inner.kept_layout(proj.shape, dims)]


@_bidir_ssd.register_fake
def _bidir_ssd_fake(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight,
                    out_bias, d_inner, ngroups, d_state, headdim, kernel, eps):
    dims = _dims(d_inner, ngroups, d_state, headdim, kernel, eps)
    kept = _layout(proj, dims)
    width = d_inner if out_weight is None else out_weight.shape[0]
    return proj.new_empty(*proj.shape[:2], width), kept


@torch.library.custom_op('mmdinomamba::bidir_ssd_backward', mutates_args=(), device_types='cpu')
def _bidir_ssd_backward(dres: Tensor, proj: Tensor, conv_weight: Tensor,
                        conv_bias: Tensor | None, dt_bias: Tensor, A: Tensor, D: Tensor,
                        norm_weight: Tensor, out_weight: Tensor | None,
                        with_out_bias: bool, kept: list[Tensor], d_inner: int, ngroups: int,
                        d_state: int, headdim: int, kernel: int, eps: float) -> list[Tensor]:
    dims = _dims(d_inner, ngroups, d_state, headdim, kernel, eps)
    with torch.profiler.record_function('bidir_ssd.backward'):
        params = [conv_weight, conv_bias, dt_bias, A, D, norm_weight]
        grads = bidir_inner.backward(dres.contiguous(), proj, params, out_weight, with_out_bias,
                                     kept, dims)
    return [proj.new_empty(_EMPTY) if g is None else g for g in grads]


@_bidir_ssd_backward.register_fake
def _bidir_ssd_backward_fake(dres, proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight,
                             out_weight, with_out_bias, kept, d_inner, ngroups, d_state, headdim,
                             kernel, eps):
    like = [proj.contiguous(), conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight,
            out_weight[:, 0] if with_out_bias and out_weight is not None else None]
    return [proj.new_empty(_EMPTY) if t is None else torch.empty_like(t) for t in like]


def _setup_context(ctx, inputs, output):
    proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight, out_bias = inputs[:9]
    ctx.save_for_backward(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight,
                          *output[1])
    ctx.sizes = inputs[9:]
    ctx.with_out_bias = out_bias is not None
    ctx.mark_non_differentiable(*output[1])


def _backward(ctx, dres, _dkept):
    saved = ctx.saved_tensors
    grads = _bidir_ssd_backward(dres, *saved[:8], ctx.with_out_bias, list(saved[8:]),
                                *ctx.sizes)
    grads = [_none(g) for g in grads]
    return (*grads, *(None, ) * len(ctx.sizes))


_bidir_ssd.register_autograd(_backward, setup_context=_setup_context)


def bidir_ssd_op(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt_bias: Tensor,
                 A: Tensor, D: Tensor, norm_weight: Tensor, dims: InnerDims,
                 out_weight: Tensor | None = None, out_bias: Tensor | None = None) -> Tensor:
    """The ``mmdinomamba::bidir_ssd`` op: :func:`~mmdinomamba.ops.reference.bidir_mixer_ref` of
    the arguments (then ``F.linear(., out_weight, out_bias)`` if given) on CPU tensors, in the
    native kernels (:mod:`.bidir_inner`); ``norm_weight`` is required (the mixer without a norm
    runs the reference's composition, :func:`~mmdinomamba.ops.bidir_ssd`)."""
    if proj.dim() != 3 or proj.shape[-1] != dims.width:
        raise ValueError(f'bidir_ssd: proj must be (b, L, {dims.width}), got '
                         f'{tuple(proj.shape)}')
    if out_weight is not None and (proj.dtype not in (torch.float32, torch.float64)
                                   or out_weight.dtype != proj.dtype or out_weight.dim() != 2
                                   or out_weight.shape[-1] != dims.d_inner):
        raise ValueError(f'bidir_ssd: out_weight must be (E, {dims.d_inner}) in the dtype of '
                         f'proj (float32 or float64), got {tuple(out_weight.shape)} '
                         f'{out_weight.dtype} for proj {proj.dtype}')
    if norm_weight is None:
        raise ValueError('bidir_ssd: the CPU op needs norm_weight')
    if out_bias is not None and out_weight is None:
        raise ValueError('bidir_ssd: out_bias needs out_weight')
    with torch.autocast(device_type='cpu', enabled=False):
        return _bidir_ssd(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight,
                          out_bias, dims.d_inner, dims.ngroups, dims.d_state, dims.headdim,
                          dims.kernel, float(dims.eps))[0]
