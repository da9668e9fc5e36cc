"""DINO loss and projection head against independent, direct computations of their formulas."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.heads import DINOHead, DINOLoss, WeightNormLinear


def reference_dino_loss(student, teacher, center, t_temp, s_temp=0.1, n_global=2):
    """Per-sample loops of DINO's Eq.: mean over (i, v != i) of mean_b sum_k -q log p (float64)."""
    B = teacher.shape[0] // n_global
    V = student.shape[0] // B
    s, t = student.double(), teacher.double()
    terms, entropies, kls = [], [], []
    for i in range(n_global):
        for b in range(B):
            z = (t[i * B + b] - center.double()[0]) / t_temp
            q = torch.exp(z - z.max())
            q = q / q.sum()
            entropies.append(-(q * torch.log(q)).sum())
            for v in range(V):
                if v == i:
                    continue
                y = s[v * B + b] / s_temp
                log_p = y - (y.max() + torch.log(torch.exp(y - y.max()).sum()))
                terms.append(-(q * log_p).sum())
                kls.append((q * (torch.log(q) - log_p)).sum())
    return (torch.stack(terms).mean(), torch.stack(entropies).mean(), torch.stack(kls).mean())


@pytest.mark.parametrize('num_views,batch', [(3, 4), (6, 2)])
def test_loss_matches_direct_formula(num_views, batch):
    K = 17
    g = torch.Generator().manual_seed(1)
    student = torch.randn(num_views * batch, K, generator=g, dtype=torch.float64) * 3
    teacher = torch.randn(2 * batch, K, generator=g, dtype=torch.float64) * 3
    loss_fn = DINOLoss(K, student_temp=0.1)
    loss_fn.center.copy_(torch.randn(1, K, generator=g))
    out = loss_fn(student, teacher, teacher_temp=0.05)
    ref_loss, ref_h, ref_kl = reference_dino_loss(student, teacher, loss_fn.center, 0.05)
    assert abs(out['loss'].item() - ref_loss.item()) <= 1e-6
    assert abs(out['teacher_entropy'].item() - ref_h.item()) <= 1e-6
    assert abs(out['kl'].item() - ref_kl.item()) <= 1e-6
    # float32 (the training dtype) agrees too, to float32 precision
    out32 = loss_fn(student.float(), teacher.float(), teacher_temp=0.05)
    assert abs(out32['loss'].item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())


def test_loss_gradient_only_to_student():
    student = torch.randn(8, 5, requires_grad=True)
    teacher = torch.randn(4, 5, requires_grad=True)
    DINOLoss(5)(student, teacher, 0.04)['loss'].backward()
    assert teacher.grad is None and student.grad.abs().sum() > 0


def test_center_update_formula():
    K, m = 7, 0.9
    loss_fn = DINOLoss(K, center_momentum=m)
    c0 = torch.randn(1, K)
    loss_fn.center.copy_(c0)
    teacher = torch.randn(6, K)
    loss_fn.update_center(teacher)  # one process: all_reduce is a no-op
    expected = c0 * m + teacher.mean(dim=0, keepdim=True) * (1 - m)
    torch.testing.assert_close(loss_fn.center, expected, rtol=0, atol=1e-6)
    assert 'center' in loss_fn.state_dict()


def test_loss_rejects_mismatched_batches():
    with pytest.raises(ValueError, match='teacher batch 6 is not 2 views'):
        DINOLoss(4)(torch.randn(8, 4), torch.randn(6, 4), 0.04)
    with pytest.raises(ValueError, match='center_momentum'):
        DINOLoss(4, center_momentum=1.5)


def test_weight_norm_linear_matches_torch_weight_norm():
    layer = WeightNormLinear(6, 5, learn_norm=True)
    with torch.no_grad():
        layer.weight_g.copy_(torch.rand(5, 1) + 0.5)
    ref = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 5, bias=False))
    with torch.no_grad():
        ref.parametrizations.weight.original0.copy_(layer.weight_g)
        ref.parametrizations.weight.original1.copy_(layer.weight_v)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), ref(x))


@pytest.mark.parametrize('norm_last_layer', [True, False])
def test_head_shapes_norms_and_frozen_scale(norm_last_layer):
    head = DINOHead(12, out_channels=33, hidden_channels=16, bottleneck_channels=8,
                    norm_last_layer=norm_last_layer)
    assert [m.out_features for m in head.mlp if isinstance(m, torch.nn.Linear)] == [16, 16, 8]
    assert sum(isinstance(m, torch.nn.GELU) for m in head.mlp) == 2
    x = torch.randn(5, 12)
    y = head(x)
    assert y.shape == (5, 33)
    assert head.last_layer.weight_g.requires_grad is (not norm_last_layer)
    rows = head.last_layer.weight.norm(dim=1)
    torch.testing.assert_close(rows, torch.ones(33))  # g initialized to 1
    # direct formula: normalize(MLP(x)) @ (v / ||v||)^T
    feat = F.normalize(head.mlp(x), dim=-1)
    v = head.last_layer.weight_v
    torch.testing.assert_close(y, feat @ (v / v.norm(dim=1, keepdim=True)).t())


def test_head_detached_last_layer_gets_no_grad():
    head = DINOHead(12, out_channels=9, hidden_channels=16, bottleneck_channels=8,
                    norm_last_layer=False)
    head(torch.randn(4, 12), detach_last_layer=True).sum().backward()
    assert head.last_layer.weight_v.grad is None and head.last_layer.weight_g.grad is None
    assert all(p.grad is not None for p in head.mlp.parameters())


def test_head_rejects_zero_layers():
    with pytest.raises(ValueError, match='num_layers=0'):
        DINOHead(4, num_layers=0)


def test_head_param_count_matches_dino():
    head = DINOHead(768)  # 768 -> 2048 -> 2048 -> 256 -> 65536 (+ g)
    n = sum(p.numel() for p in head.parameters())
    expected = (768 * 2048 + 2048) + (2048 * 2048 + 2048) + (2048 * 256 + 256) + 256 * 65536 \
        + 65536
    assert n == expected
    assert math.isclose(n / 1e6, 23.1, abs_tol=0.1)


def reference_sinkhorn(logits, temp, iters):
    """DINOv2's ``sinkhorn_knopp_teacher`` on one process, written out (float64)."""
    q = torch.exp(logits.double() / temp).T
    B, K = q.shape[1], q.shape[0]
    q = q / q.sum()
    for _ in range(iters):
        q = q / q.sum(dim=1, keepdim=True) / K
        q = q / q.sum(dim=0, keepdim=True) / B
    return (q * B).T


def test_sinkhorn_knopp_matches_dinov2_and_balances_prototypes():
    from mmdinomamba.models.heads import sinkhorn_knopp
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 6, generator=g, dtype=torch.float64)
    logits[:, 0] += 3  # a teacher that prefers prototype 0 for every sample
    q = sinkhorn_knopp(logits, temp=0.1, num_iters=3)
    torch.testing.assert_close(q, reference_sinkhorn(logits, 0.1, 3))
    torch.testing.assert_close(q.sum(dim=1), torch.ones(12, dtype=torch.float64))
    many = sinkhorn_knopp(logits, temp=0.1, num_iters=50)
    torch.testing.assert_close(many.sum(dim=0), torch.full((6,), 2., dtype=torch.float64),
                               atol=1e-3, rtol=0)  # 12 samples spread evenly over 6 prototypes


def test_sinkhorn_centering_loss_and_signals():
    K, B = 8, 5
    g = torch.Generator().manual_seed(2)
    student = torch.randn(3 * B, K, generator=g)
    teacher = torch.randn(2 * B, K, generator=g)
    teacher[:, 1] += 4.
    loss_fn = DINOLoss(K, centering='sinkhorn_knopp', sinkhorn_iters=3)
    out = loss_fn(student, teacher, teacher_temp=0.1)
    from mmdinomamba.models.heads import sinkhorn_knopp
    q = sinkhorn_knopp(teacher, 0.1, 3)
    log_p = F.log_softmax(student / 0.1, dim=-1).chunk(3)
    terms = [(-qi * log_p[v]).sum(-1).mean() for i, qi in enumerate(q.chunk(2))
             for v in range(3) if v != i]
    torch.testing.assert_close(out['loss'], torch.stack(terms).mean())
    # the signals watch the raw teacher (here piled onto prototype 1), not the balanced targets
    assert out['prototypes_used'] == 1
    with pytest.raises(ValueError, match="centering='other'"):
        DINOLoss(K, centering='other')


def test_koleo_loss_matches_its_definition():
    from mmdinomamba.models.heads import koleo_loss
    x = torch.tensor([[1., 0.], [0.9, 0.1], [0., 1.]])
    xn = F.normalize(x, dim=-1)
    d = torch.cdist(xn, xn) + torch.eye(3) * 10
    torch.testing.assert_close(koleo_loss(x), -torch.log(d.min(dim=1).values + 1e-8).mean())
