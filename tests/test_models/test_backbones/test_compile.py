"""``torch.compile`` of the backbones (``benchmark.py --compile``): forward and backward equal
eager mode. ``aot_eager`` traces the graphs (dynamo + AOT autograd, the part that failed on an
``out=`` write into a view of the portable scan) without inductor's slow C++ compile."""
import pytest
import torch

from mmdinomamba.models.backbones import MILA, DinoVim, LinearViT, ViT

TINY = {
    'DinoVim': lambda: DinoVim(arch=dict(embed_dims=64, num_layers=2), patch_size=16, img_size=64,
                               mixer_cfg=dict(d_state=16, headdim=16), drop_path_rate=0.),
    'ViT': lambda: ViT(arch=dict(embed_dims=64, num_layers=2, num_heads=2), patch_size=16,
                       img_size=64),
    'LinearViT': lambda: LinearViT(arch=dict(embed_dims=64, num_layers=2, num_heads=2),
                                   patch_size=16, img_size=64),
    'MILA': lambda: MILA(arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                                   num_heads=[1, 2, 4, 8]), drop_path_rate=0.),
}


@pytest.mark.parametrize('name', sorted(TINY))
def test_compiled_backbone_matches_eager(name):
    torch.manual_seed(0)
    model = TINY[name]()
    x = torch.randn(2, 3, 64, 48)  # non-square

    def run(fn):
        model.zero_grad(set_to_none=True)
        out = fn(x)
        sum(o.float().square().sum() for o in out).backward()
        return [o.detach() for o in out] + [p.grad.clone() for p in model.parameters()]

    want = run(model)
    torch._dynamo.reset()
    got = run(torch.compile(model, backend='aot_eager'))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_compiled_chunked_scan_matches_eager():
    """The chunked SSD scan (sequences beyond the quadratic form) under ``torch.compile``:
    forward and every gradient equal eager mode."""
    from mmdinomamba.ops import ssd_scan_chunked
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(1, 100, 2, 8, generator=gen), torch.rand(1, 100, 2, generator=gen) * .1,
            -torch.rand(2, generator=gen) - .5, torch.randn(1, 100, 1, 4, generator=gen),
            torch.randn(1, 100, 1, 4, generator=gen), torch.randn(2, generator=gen)]

    def run(fn):
        ins = [a.clone().requires_grad_() for a in args]
        out = fn(*ins, chunk_size=16)
        out.square().sum().backward()
        return [out.detach()] + [a.grad for a in ins]

    want = run(ssd_scan_chunked)
    torch._dynamo.reset()
    for a, b in zip(run(torch.compile(ssd_scan_chunked, backend='aot_eager')), want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
