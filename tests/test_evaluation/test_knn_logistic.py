"""k-NN (DINO's weighted vote) against scikit-learn; the L-BFGS logistic probe converges."""
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from mmdinomamba.evaluation import fit_logistic_probe, knn_predict, knn_scores


def _features(n, d, classes, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize('k,temperature', [(20, 0.07), (5, 0.5), (1, 0.07)])
def test_knn_equals_sklearn_with_dinos_weights(k, temperature):
    train, labels = _features(300, 16, 5, seed=0)
    test, _ = _features(120, 16, 5, seed=1)
    ours = knn_predict(train, labels, test, num_classes=5, k=k, temperature=temperature)
    # cosine distance d = 1 - cos, DINO's weight exp(cos / T) = exp((1 - d) / T)
    ref = KNeighborsClassifier(n_neighbors=k, metric='cosine', algorithm='brute',
                               weights=lambda d: np.exp((1 - d) / temperature))
    ref.fit(train.numpy(), labels.numpy())
    assert torch.equal(ours, torch.from_numpy(ref.predict(test.numpy())).long())


def test_knn_scores_are_the_weighted_votes():
    bank = torch.tensor([[1., 0.], [0., 1.], [1., 1.]])
    labels = torch.tensor([0, 1, 1])
    scores = knn_scores(bank, labels, torch.tensor([[1., 0.2]]), num_classes=3, k=2,
                        temperature=0.5)
    cos = torch.nn.functional.normalize(bank, dim=1) @ torch.nn.functional.normalize(
        torch.tensor([1., 0.2]), dim=0)  # neighbours: rows 0 (cos .98) and 2 (cos .83)
    expected = torch.tensor([[cos[0].div(0.5).exp(), cos[2].div(0.5).exp(), 0.]])
    torch.testing.assert_close(scores, expected)


def test_knn_rejects_bad_input():
    train, labels = _features(10, 4, 3, seed=0)
    with pytest.raises(ValueError, match='labels must lie in'):
        knn_scores(train, labels + 5, train, num_classes=3)
    with pytest.raises(ValueError, match=r'\(N, D\) and \(M, D\)'):
        knn_scores(train, labels, torch.randn(3, 5), num_classes=3)


def test_logistic_probe_converges_on_a_separable_toy_set():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 32, generator=g) * 3
    y = torch.arange(400) % 4
    x = centres[y] + torch.randn(400, 32, generator=g)
    x = x * 50 + 7  # unnormalized features, as a frozen backbone gives them
    probe = fit_logistic_probe(x[:300], y[:300], num_classes=4, l2=1e-3)
    assert probe.converged
    assert (probe.predict(x[300:]) == y[300:]).float().mean() == 1.0


def test_logistic_probe_equals_sklearn_on_the_same_objective():
    x, y = _features(200, 8, 3, seed=3)
    x = x + torch.nn.functional.one_hot(y, 8)[:, :8].float() * 1.5
    C = 0.5
    probe = fit_logistic_probe(x, y, num_classes=3, l2=1 / (C * len(x)), tol=1e-8)
    xs = ((x - x.mean(0)) / x.std(0, unbiased=False)).numpy().astype(np.float64)
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(xs, y.numpy())
    # multinomial logits are defined up to a per-sample constant: compare centered logits
    ours = probe.logits(x).double()
    theirs = torch.from_numpy(ref.decision_function(xs))
    torch.testing.assert_close(ours - ours.mean(1, keepdim=True),
                               theirs - theirs.mean(1, keepdim=True), atol=2e-3, rtol=0)
