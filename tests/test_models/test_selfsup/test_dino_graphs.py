"""The CUDA-graph switch of DINO: on a CPU, its static-buffer path run eagerly gives the plain
step's numbers, the warm-up counts iterations, and the switch itself needs CUDA."""
import pytest
import torch
from mmpretrain.registry import MODELS

from mmdinomamba.models.selfsup import CropGraphs


def tiny_dino(**kwargs):
    return MODELS.build(dict(
        type='DINO',
        backbone=dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=1), img_size=32,
                      patch_size=8, mixer_cfg=dict(d_state=8, headdim=16), drop_path_rate=0.1),
        head=dict(type='DINOHead', in_channels=32, out_channels=64, hidden_channels=32,
                  bottleneck_channels=16),
        freeze_last_layer=1, **kwargs))


def _steps(model, views, n, seed=0):
    """n iterations of loss + backward + a plain SGD step and the EMA; losses and grads."""
    out = []
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    for it in range(n):
        model.set_progress(it, 8, 2)  # the last layer is frozen for the first 2 iterations
        loss = model.loss([v[it % 2] for v in views])['loss']
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads = [None if p.grad is None else p.grad.clone() for p in params]
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.sub_(0.1 * p.grad)
        model.update_teacher()
        out.append((loss.detach(), grads))
    return out


def test_static_buffer_path_equals_the_plain_step():
    torch.manual_seed(0)
    plain = tiny_dino()
    plain.init_weights()
    graphed = tiny_dino()
    graphed.load_state_dict(plain.state_dict())
    graphed.crop_graphs = CropGraphs(warmup_iters=2, capture=False)
    plain.train(), graphed.train()
    g = torch.Generator().manual_seed(1)
    # 5 views (2 global, 3 local) of batch 2, two different batches per view, alternating
    views = [list(torch.randn(2, 2, 3, s, s, generator=g).unbind(0))
             for s in (32, 32, 16, 16, 16)]
    a, b = _steps(plain, views, 5), _steps(graphed, views, 5)
    for it, ((la, ga), (lb, gb)) in enumerate(zip(a, b)):
        assert torch.equal(la, lb), it
        for x, y in zip(ga, gb):
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), it
    names = [n for n, p in graphed.named_parameters() if p.requires_grad]
    last = names.index('head.last_layer.weight_v')  # frozen for 2 iterations, then trained
    assert [b[it][1][last] is None for it in range(5)] == [True, True, False, False, False]
    # warm-up: 2 eager iterations, then one static buffer per call (teacher 32 px; student 32
    # and 16 px), reused at every later iteration
    g2 = graphed.crop_graphs
    assert g2.iterations == 5 and g2.ready
    assert {(role, shape) for role, shape, _ in g2.keys()} == {
        ('student', (6, 3, 16, 16)), ('student', (4, 3, 32, 32)), ('teacher', (4, 3, 32, 32))}


def test_warmup_counts_training_iterations_only():
    graphs = CropGraphs(warmup_iters=3, capture=False)
    backbone = torch.nn.Identity()
    calls = []

    def bb(x):
        calls.append(x.data_ptr())
        return (x,)

    x = torch.randn(2, 3)
    for _ in range(3):
        graphs.start_iteration()
        assert not graphs.ready and graphs.student(bb, x) is x  # eager: the input itself
    graphs.start_iteration()
    assert graphs.ready
    y = graphs.student(bb, x)
    assert y is not x and torch.equal(y, x) and graphs.keys()[0][0] == 'student'
    assert calls[-1] != x.data_ptr()  # ran on the static buffer
    with pytest.raises(ValueError, match='warmup_iters'):
        CropGraphs(warmup_iters=0)
    del backbone


def test_eval_mode_does_not_count():
    model = tiny_dino()
    model.crop_graphs = CropGraphs(warmup_iters=1, capture=False)
    model.eval()
    with torch.no_grad():
        model.loss([torch.randn(2, 3, 32, 32)] * 2 + [torch.randn(2, 3, 16, 16)])
    assert model.crop_graphs.iterations == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error without CUDA')
def test_switch_needs_cuda():
    with pytest.raises(ValueError, match=r'cuda_graphs=True .*needs CUDA.*cuda_graphs=False'):
        tiny_dino(cuda_graphs=True)


@pytest.mark.gpu
def test_graphed_step_matches_eager_on_cuda():
    """Graph replay against the eager step (bf16 autocast; dropout of the student off so the
    random streams do not matter)."""
    torch.manual_seed(0)
    eager = tiny_dino().cuda()
    eager.init_weights()
    graphed = tiny_dino(cuda_graphs=dict(warmup_iters=1)).cuda()
    graphed.load_state_dict(eager.state_dict())
    for m in (eager, graphed):
        m.train()
        for mod in m.modules():
            if hasattr(mod, 'drop_prob'):
                mod.drop_prob = 0.
    views = [[torch.randn(4, 3, s, s, device='cuda') for _ in range(2)]
             for s in (32, 32, 16, 16, 16)]
    with torch.autocast('cuda', dtype=torch.bfloat16):
        a, b = _steps(eager, views, 4), _steps(graphed, views, 4)
    for (la, ga), (lb, gb) in zip(a[1:], b[1:]):
        torch.testing.assert_close(la, lb, rtol=2e-2, atol=2e-2)
        for x, y in zip(ga, gb):
            assert (x is None) == (y is None)
            if x is not None:
                torch.testing.assert_close(x, y, rtol=5e-2, atol=5e-3)
