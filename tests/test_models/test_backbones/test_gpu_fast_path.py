"""GPU: DinoVim's fast path (Triton SSD, fused gated RMSNorm, causal_conv1d when installed) vs the
portable path, both in bf16 autocast against a float64 run (issue: fast path <= ~2x the portable
path's own bf16 error). Skipped without CUDA; run on a GPU with `pytest -m gpu`."""
import pytest
import torch

from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.ops import portable_ops


def _run(model, x, w, amp):
    model.zero_grad(set_to_none=True)
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
        out = model(x.to(next(model.parameters()).dtype))
    feats = torch.cat([o.flatten(1) for o in out], 1).double()
    (feats * w).sum().backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return feats.detach(), grads


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize('hw', [(224, 224), (256, 320)])
def test_dinovim_t_fast_path_matches_portable(hw):
    torch.manual_seed(0)
    model = DinoVim(arch='t', img_size=224, out_indices=(5, 11, 23), out_type='cls_token').cuda()
    x = torch.randn(2, 3, *hw, device='cuda')
    ref = DinoVim(arch='t', img_size=224, out_indices=(5, 11, 23), out_type='cls_token')
    ref.load_state_dict(model.state_dict())
    ref = ref.cuda().double()
    w = torch.randn(2, 3 * model.embed_dims, device='cuda', dtype=torch.float64)
    with portable_ops():
        y64, g64 = _run(ref, x, w, amp=False)
        y_pt, g_pt = _run(model, x, w, amp=True)
    y_fast, g_fast = _run(model, x, w, amp=True)
    assert torch.isfinite(y_fast).all()
    e_fast, e_pt = _rel(y_fast, y64), _rel(y_pt, y64)
    assert e_fast <= 2 * e_pt + 1e-3, (e_fast, e_pt)
    worst = max(_rel(g_fast[n], g64[n]) - 2 * _rel(g_pt[n], g64[n]) for n in g64)
    assert worst <= 1e-3, worst
