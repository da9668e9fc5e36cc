"""Benchmark-only variants of the fast paths, for A/B timing, memory accounting and tests.

Users choose between the fast path and the specification with one switch
(``BiSSD(fast_path=True)``); the pieces of the fast path are switched here, for one block of
code, without touching any model::

    from mmdinomamba.ops import fast_path_variant

    with fast_path_variant(recompute_conv=False, fused_merge=False):
        y = model(x)   # every BiSSD inside runs the chosen variant

Every variant computes the same result up to rounding.
"""
import contextlib
import dataclasses
from typing import Iterator

__all__ = [
    'FastPathVariant', 'fast_path_variant', 'current_variant', 'quadratic_max_len',
    'QUADRATIC_MAX_LEN'
]

#: Longest sequence the CPU fast path computes in the quadratic form for heads of 64 channels and
#: 64 states (half as long for smaller ones); longer ones use the chunked scan, whose work grows
#: linearly with the length. Measured crossovers (fwd+bwd of a BiSSD layer, 1 CPU thread): about
#: 550 tokens for DinoVim-T's mixer, 250 for d_state=16, headdim=16. Since the chunked scan runs
#: in native kernels (2 threads, freed memory kept): the quadratic form is still 1.5x faster at
#: 512 tokens and as fast at 785 for DinoVim-T's mixer, 1.2x faster at 256 for the small heads.
QUADRATIC_MAX_LEN = 512


@dataclasses.dataclass(frozen=True)
class FastPathVariant:
    """The pieces of the bidirectional mixer's fast path (all but ``recompute_merge`` and
    ``recompute_conv_cpu`` on by default).

    Attributes:
        single_scan (bool): both directions in one scan call (False: two calls).
        fused_conv (bool): CUDA: both directions' conv + SiLU in our fused Triton kernel
            (False: flip / cat / depthwise conv).
        fused_merge (bool): CUDA: un-flip, both gated RMSNorms and the average in our fused
            Triton kernel (False: separate ops).
        recompute_conv (bool): CUDA, with ``fused_conv`` and ``single_scan``: conv and scan as
            one autograd function that recomputes the conv in the backward pass.
        recompute_merge (bool): CUDA, with ``fused_merge``: recompute the merged output in the
            backward pass instead of keeping it for ``out_proj`` (off by default: DinoVim-B's
            training step on one H100 ran 1.27x faster keeping it, at 1.14x the peak memory,
            still below the official code's; on saves memory where it is short).
        quadratic_max_len (int | None): CPU: sequences up to this length run as one autograd
            function (conv, scan in the quadratic form, merge); longer ones, or all with 0, as
            separate ops with the chunked scan. None: :func:`quadratic_max_len`.
        triangle_blocks (bool): CPU, quadratic form: skip the all-zero token blocks of its
            triangular matrix products (:mod:`.ssd_triangles`; False: full products).
        native_cpu (bool): CPU, quadratic form: both directions' conv + SiLU, the gated
            merge and the (L, L) work of the scan's strongly decaying heads in the native C++
            kernels (:mod:`.native_cpu`; False, or when they cannot be built:
            PyTorch ops).
        recurrent_scan (bool): CPU, quadratic form with ``native_cpu``: heads of 16 channels
            with 16 states (the demo's) scanned by their recurrence in the native kernels
            (:func:`.native_cpu.recurrent_scan_forward`; False: the quadratic form).
        recompute_conv_cpu (bool): CPU, quadratic form with ``native_cpu``: recompute both
            directions' conv output in the backward pass instead of keeping it (off by
            default: keeping it made DinoVim-T's training step about 5% faster, the demo's
            DINO step not measurably, for 2 (d + 2 g n) floats more per token and layer;
            docs/results.md); on saves that memory.
        fused_wide_heads (bool): CPU, quadratic form with ``native_cpu``: the strongly
            decaying heads in one native call each way, reading and adding to the full tensors
            in place (:func:`.native_cpu.wide_forward`; False: gathered, computed with the
            native (L, L) kernels and scattered back by PyTorch ops).
        fused_products (bool): CPU, quadratic form with ``native_cpu``: the factored heads'
            (L, L) products and the element-wise work around them in one native call each
            way, one (sample, direction, group) a task (:func:`.native_cpu.products_forward`;
            False: scaled copies, products and per-token passes as separate native calls).
        fused_output (bool): CPU, quadratic form with ``native_cpu``: the backward pass
            rebuilds the scan's output inside the merge's native backward kernel, tile by
            tile, from the scan's kept product (:func:`.native_cpu.merge_backward_scan`;
            False: written whole by :func:`.native_cpu.scan_output`, then read by the merge).
        serial_blas (bool): CPU, native kernels: every GEMM inside their parallel loops runs
            on its calling thread alone (MKL's thread-local count set to one around it;
            False: MKL's own threading, which then opens a nested team of all threads for each
            such GEMM, since PyTorch switches MKL's dynamic thread count off).
    """
    single_scan: bool = True
    fused_conv: bool = True
    fused_merge: bool = True
    recompute_conv: bool = True
    recompute_merge: bool = False
    quadratic_max_len: int | None = None
    triangle_blocks: bool = True
    native_cpu: bool = True
    recurrent_scan: bool = True
    recompute_conv_cpu: bool = False
    fused_wide_heads: bool = True
    fused_products: bool = True
    fused_output: bool = True
    serial_blas: bool = True


_current = FastPathVariant()


def quadratic_max_len(headdim: int, d_state: int) -> int:
    """The longest sequence scanned in the quadratic form for heads of ``headdim`` channels and
    ``d_state`` states (the variant's ``quadratic_max_len`` if set)."""
    if _current.quadratic_max_len is not None:
        return _current.quadratic_max_len
    return QUADRATIC_MAX_LEN if min(headdim, d_state) >= 64 else QUADRATIC_MAX_LEN // 2


def current_variant() -> FastPathVariant:
    """The variant in force (the defaults outside :func:`fast_path_variant`)."""
    return _current


@contextlib.contextmanager
def fast_path_variant(**changes) -> Iterator[FastPathVariant]:
    """Run the enclosed code with the given :class:`FastPathVariant` fields changed (nests;
    an unknown field is a ``TypeError`` naming it)."""
    global _current
    fields = {f.name for f in dataclasses.fields(FastPathVariant)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise TypeError(f'fast_path_variant: unknown switch(es) {unknown}; known: '
                        f'{sorted(fields)}')
    saved = _current
    _current = dataclasses.replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved
