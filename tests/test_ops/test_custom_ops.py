"""The ops' contract: ``mmdinomamba::bidir_ssd`` is a ``torch.library`` op (opcheck), the
profiler shows it (and none inside ``reference_ops()``), kernels and reference agree, a DinoVim
block traces with no graph break and compiles to the eager result, and the reference imports
no kernel."""
import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.models.backbones.blocks import Block
from mmdinomamba.models.mixers import BiSSD
from mmdinomamba.ops import InnerDims, RMSNorm, native_cpu, reference_ops
from mmdinomamba.ops.cpu.custom_ops import bidir_ssd_op

REFERENCE = Path(__file__).parents[2] / 'mmdinomamba' / 'ops' / 'reference'
DEMO = dict(arch=dict(embed_dims=64, num_layers=4), mixer_cfg=dict(d_state=16, headdim=16),
            img_size=64, patch_size=8, drop_path_rate=0.)


def _op_inputs(dims: InnerDims, length: int, dtype=torch.float32, strong=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h, c = dims.nheads, dims.conv_dim
    proj = torch.randn(2, length, dims.width, generator=gen, dtype=dtype)
    A = -torch.rand(2, h, generator=gen, dtype=dtype) * 8 - 1
    if strong:  # two heads decaying too strongly for the factored form
        A[0, 0] = A[1, -1] = -300.
    return [proj, torch.randn(2, c, dims.kernel, generator=gen, dtype=dtype) / 2,
            torch.randn(2, c, generator=gen, dtype=dtype) / 10,
            torch.full((2, h), -3., dtype=dtype), A, torch.randn(2, h, generator=gen, dtype=dtype),
            1 + torch.randn(2, dims.d_inner, generator=gen, dtype=dtype) / 4]


def _sizes(dims: InnerDims) -> tuple:
    return (dims.d_inner, dims.ngroups, dims.d_state, dims.headdim, dims.kernel, dims.eps)


@pytest.fixture(autouse=True)
def _kernels():
    if not native_cpu.available():
        pytest.fail(f'the native CPU kernels are not available: {native_cpu.load_error()}')


@pytest.mark.parametrize('dims,length,strong,projected,bias', [
    (InnerDims(64, 1, 16, 16, 4), 23, False, True, True),  # the demo's heads
    (InnerDims(64, 2, 8, 8, 4), 40, True, False, True),  # quadratic, strongly decaying heads
    (InnerDims(64, 2, 8, 8, 3), 130, False, True, False),  # token blocks, no conv bias
])
def test_opcheck_passes_for_both_ops(dims, length, strong, projected, bias):
    ins = [t.requires_grad_() for t in _op_inputs(dims, length, strong=strong)]
    if not bias:
        ins[2] = None
    out_w = torch.randn(24, dims.d_inner, requires_grad=True) if projected else None
    out_b = torch.randn(24, requires_grad=True) if projected else None
    args = (*ins, out_w, out_b, *_sizes(dims))
    torch.library.opcheck(torch.ops.mmdinomamba.bidir_ssd.default, args)
    out, kept = torch.ops.mmdinomamba.bidir_ssd.default(*args)
    if strong:  # the wide-head mask: 2 heads x 2 samples
        assert [int(t.sum()) for t in kept if t.dtype == torch.bool] == [2 * 2]
    back = (torch.randn_like(out), *[None if t is None else t.detach() for t in ins], out_w,
            projected, [t.detach() for t in kept], *_sizes(dims))
    torch.library.opcheck(torch.ops.mmdinomamba.bidir_ssd_backward.default, back,
                          test_utils=('test_schema', 'test_faketensor'))


def _names(fn) -> list[str]:
    with torch.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.events()]


def _step(model, x, w):
    model.zero_grad(set_to_none=True)
    out = model(x)
    (torch.cat([o.flatten(1) for o in out], 1) * w).sum().backward()
    return [o.detach() for o in out] + [p.grad.clone() for p in model.parameters()]


def test_profiler_shows_the_ops_and_none_under_the_reference():
    """A DinoVim (the demo's sizes) forward runs ``mmdinomamba::`` ops, inside
    ``reference_ops()`` none; the two agree to float32 precision (output and every gradient,
    both within 3e-5 of float64)."""
    torch.manual_seed(0)
    model = DinoVim(**DEMO, out_type='cls_token')
    x, w = torch.randn(2, 3, 64, 64), torch.randn(2, 64)
    with torch.no_grad():
        names = _names(lambda: model(x))
    assert 'mmdinomamba::bidir_ssd' in names and 'bidir_ssd.scan' in names
    with torch.no_grad(), reference_ops():
        assert not [n for n in _names(lambda: model(x)) if n.startswith(('mmdinomamba', 'bidir'))]
    kernels = _step(model, x, w)
    with reference_ops():
        ref = _step(model, x, w)
        exact = _step(model.double(), x.double(), w.double())
    for got, spec, want in zip(kernels, ref, exact):
        err, err_ref = ((got.double() - want).norm() / want.norm()).item(), (
            (spec.double() - want).norm() / want.norm()).item()
        assert err <= 3e-5, (err, err_ref)  # the reference's own: below 2e-6


def _block():
    """One DinoVim-T block (width 256, heads of 64 channels and 64 states), its input of 197
    tokens and their grid."""
    torch.manual_seed(0)
    block = Block(RMSNorm(256, eps=1e-5), BiSSD(256))
    return block, torch.randn(1, 197, 256), (14, 14)


def test_a_dinovim_block_traces_with_no_graph_break():
    block, x, hw = _block()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x, hw)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize('backend', ['aot_eager', pytest.param('inductor',
                                                                 marks=pytest.mark.slow)])
def test_a_compiled_block_equals_eager(backend):
    """``torch.compile(fullgraph=True)`` of a DinoVim-T block (the op as one node): output and
    every gradient equal eager mode."""
    block, x, hw = _block()
    x.requires_grad_()

    def run(fn):
        block.zero_grad(set_to_none=True)
        x.grad = None
        y = fn(x, hw)
        y.square().sum().backward()
        return [y.detach(), x.grad.clone()] + [p.grad.clone() for p in block.parameters()]

    want = run(block)
    torch._dynamo.reset()
    got = run(torch.compile(block, backend=backend, fullgraph=True))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1., b.abs().max().item()))


def test_the_switch_also_applies_under_compile():
    # (the reference's chunked scan has data-dependent branches: no fullgraph for it)
    block, x, hw = _block()
    torch._dynamo.reset()
    compiled = torch.compile(block, backend='eager')
    with torch.no_grad():
        assert 'mmdinomamba::bidir_ssd' in _names(lambda: compiled(x, hw))
        with reference_ops():
            assert 'mmdinomamba::bidir_ssd' not in _names(lambda: compiled(x, hw))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) of every import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ''))
    return found


def test_the_reference_imports_no_kernel():
    """``ops/reference`` imports only torch, the standard library and itself: nothing of the
    CPU or CUDA kernels, Triton or mamba_ssm."""
    files = sorted(REFERENCE.glob('*.py'))
    assert len(files) >= 5
    for path in files:
        for level, module in _imports(path):
            top = module.split('.')[0]
            assert level <= 1, (path.name, module)  # within reference/ only
            assert level == 1 or top in ('torch', 'dataclasses', 'typing', 'math', 'collections',
                                         'functools'), (path.name, module)


def test_switched_off_by_the_environment_in_a_fresh_process():
    code = ('import torch\nfrom mmdinomamba.ops import native_cpu, kernels_enabled\n'
            'assert not kernels_enabled() and not native_cpu.available()\nprint("OFF")')
    env = dict(os.environ, MMDINOMAMBA_KERNELS='0')
    done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and 'OFF' in done.stdout, done.stderr[-2000:]


def test_bad_projection_is_named():
    dims = InnerDims(64, 1, 8, 8, 4)
    ins = _op_inputs(dims, 9)
    with pytest.raises(ValueError, match=r'proj must be \(b, L, 152\)'):
        bidir_ssd_op(ins[0][..., :10], *ins[1:], dims)
    assert math.isfinite(bidir_ssd_op(*ins, dims).sum().item())
