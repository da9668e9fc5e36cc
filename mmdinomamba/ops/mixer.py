"""``bidir_ssd``: the door of the bidirectional Mamba-2 mixer between its projections.

It picks, once per call and from static facts only (device, dtype, sizes, the switch; no look
at the data, so no host sync and no graph break), one path:

* CPU, native kernels built, a norm weight, at most
  :func:`quadratic_max_len` tokens: the ``mmdinomamba::bidir_ssd`` op
  (:mod:`.cpu.custom_ops`; conv, quadratic scan and merge, and ``out_proj`` where it is a plain
  ``nn.Linear``);
* CUDA with the kernels: the ops ``mmdinomamba::bidir_conv_scan`` (our conv kernel and
  ``mamba_ssm``'s scan) and ``mmdinomamba::bidir_gated_merge`` (our merge kernel) of
  :mod:`.cuda` (one graph node each under ``torch.compile``);
* longer CPU sequences (and the mixer without a norm): the same composition, with the native
  chunked scan, under activation checkpointing (the projection kept, the rest recomputed in the
  backward pass);
* everything else, and inside :func:`~mmdinomamba.ops.reference_ops`: the reference
  (:func:`~mmdinomamba.ops.reference.bidir_mixer_ref`).
"""
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .bidir_conv_scan import bidir_conv_scan
from .cpu import native_cpu
from .cpu.custom_ops import bidir_ssd_op
from .cuda import _triton
from .norm import bidir_gated_merge
from .reference.mixer import InnerDims, bidir_mixer_ref, direction_inputs
from .reference.ssd_ref import ssd_scan_ref
from .switch import kernels_enabled

__all__ = ['bidir_ssd', 'plain_linear', 'QUADRATIC_MAX_LEN', 'quadratic_max_len']

#: Longest sequence the CPU op scans in the quadratic form for heads of 64 channels and 64
#: states (half as long for smaller ones); longer ones use the chunked scan, whose work grows
#: linearly with the length (measured crossover, fwd+bwd of a BiSSD layer, 2 threads: the
#: quadratic form is 1.5x faster at 512 tokens and as fast at 785 for DinoVim-T's mixer).
QUADRATIC_MAX_LEN = 512


def quadratic_max_len(headdim: int, d_state: int) -> int:
    """The longest sequence the CPU op scans in the quadratic form for heads of ``headdim``
    channels and ``d_state`` states."""
    return QUADRATIC_MAX_LEN if min(headdim, d_state) >= 64 else QUADRATIC_MAX_LEN // 2


_HOOKS = ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks')


@torch.compiler.assume_constant_result
def _native_built() -> bool:
    """Whether the native CPU kernels are built (builds them on the first call; a constant for
    ``torch.compile``)."""
    return native_cpu._module() is not None


def plain_linear(module: nn.Module) -> bool:
    """Whether calling ``module`` only runs ``F.linear(x, weight, bias)``: an ``nn.Linear``
    itself (not a subclass) with no hooks of its own and no global module hooks."""
    glob = torch.nn.modules.module
    return type(module) is nn.Linear and not any(
        getattr(module, h, None) or getattr(glob, '_global' + h, None) for h in _HOOKS)


def _cpu_op_fits(proj: Tensor, norm_weight: Tensor | None, dims: InnerDims) -> bool:
    return (proj.device.type == 'cpu' and proj.dtype.is_floating_point
            and norm_weight is not None and 2 <= dims.kernel <= 4
            and proj.shape[1] <= quadratic_max_len(dims.headdim, dims.d_state)
            and _native_built())


def bidir_ssd(proj: Tensor, conv_weight: Tensor, conv_bias: Tensor | None, dt_bias: Tensor,
              A: Tensor, D: Tensor, norm_weight: Tensor | None, dims: InnerDims,
              out_proj: nn.Module, backend: str = 'auto', chunk_size: int = 256,
              recompute_merge: bool = False) -> Tensor:
    """``out_proj`` of both directions of a bidirectional Mamba-2 mixer
    (:func:`~mmdinomamba.ops.reference.bidir_mixer_ref` of the arguments says exactly what).

    Args:
        proj (Tensor): (b, L, 2 d + 2 g n + h) ``in_proj`` output ``[z, x, B, C, dt]``.
        conv_weight (Tensor): (2, d + 2 g n, K) filters of the two directions.
        conv_bias (Tensor | None): (2, d + 2 g n).
        dt_bias (Tensor): (2, h).
        A (Tensor): (2, h) negative decay rates.
        D (Tensor): (2, h) skip weights.
        norm_weight (Tensor | None): (2, d) RMSNorm scales, or None (no norm).
        dims (InnerDims): the mixer's sizes.
        out_proj (nn.Module): the output projection.
        backend (str): ``'ref'``: the reference with the sequential recurrence; ``'torch'``:
            no ``mamba_ssm`` on CUDA; ``'triton'``: not the CPU op. Defaults to 'auto'.
        chunk_size (int): chunk length of the CUDA scan (fitted down to shorter sequences:
            :func:`~mmdinomamba.ops.cuda._triton.fitted_chunk`). Defaults to 256.
        recompute_merge (bool): CUDA: recompute the merged output in the backward pass
            instead of keeping it for ``out_proj`` (less memory, a little slower). Defaults to
            False.

    Returns:
        Tensor: (b, L, E) ``out_proj`` output.
    """
    if backend == 'ref' or not kernels_enabled():
        scan = ssd_scan_ref if backend == 'ref' else None
        mixed = bidir_mixer_ref(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, dims,
                                *(() if scan is None else (scan, )))
        return out_proj(mixed)
    if (backend != 'triton' and not _triton.on_kernel_device(proj)
            and _cpu_op_fits(proj, norm_weight, dims)):
        inside = (plain_linear(out_proj) and not torch.is_autocast_enabled('cpu')
                  and proj.dtype == out_proj.weight.dtype
                  and proj.dtype in (torch.float32, torch.float64))
        out = bidir_ssd_op(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, dims,
                           *((out_proj.weight, out_proj.bias) if inside else ()))
        return out if inside else out_proj(out)
    if not _triton.on_kernel_device(proj) and torch.is_grad_enabled():
        # long CPU sequences: keep the projection only and recompute conv, scan and merge in the
        # backward pass (no more activations per token than the short sequences' op keeps)
        return out_proj(checkpoint(_composed, proj, conv_weight, conv_bias, dt_bias, A, D,
                                   norm_weight, dims, backend, chunk_size, use_reentrant=False))
    if not recompute_merge or not torch.is_grad_enabled():
        return out_proj(_composed(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, dims,
                                  backend, chunk_size))
    y, z = _conv_scan(proj, conv_weight, conv_bias, dt_bias, A, D, dims, backend, chunk_size)
    return checkpoint(lambda y, z: out_proj(_merge(y, z, norm_weight, dims)), y, z,
                      use_reentrant=False)


def _conv_scan(proj, conv_weight, conv_bias, dt_bias, A, D, dims: InnerDims, backend: str,
               chunk_size: int) -> tuple[Tensor, Tensor]:
    """Both directions' scan output (b, L, 2 d) (backward half flipped) and the gate ``z``."""
    z, xBC, dt, dt_bias, A, D = direction_inputs(proj, dt_bias, A, D, dims)
    y = bidir_conv_scan(xBC, conv_weight, conv_bias, dt, dt_bias, A, D, dims.splits,
                        dims.headdim, dims.d_state, chunk_size, backend)
    return y.flatten(2), z


def _merge(y: Tensor, z: Tensor, norm_weight: Tensor | None, dims: InnerDims) -> Tensor:
    return bidir_gated_merge(y, z, norm_weight, dims.eps, dims.d_inner // dims.ngroups)


def _composed(proj, conv_weight, conv_bias, dt_bias, A, D, norm_weight, dims: InnerDims,
              backend: str, chunk_size: int) -> Tensor:
    """The mixed output (b, L, d) of the ops one after another (the kernels each dispatches)."""
    y, z = _conv_scan(proj, conv_weight, conv_bias, dt_bias, A, D, dims, backend, chunk_size)
    return _merge(y, z, norm_weight, dims)
