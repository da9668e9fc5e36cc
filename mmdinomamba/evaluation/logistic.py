"""A linear probe that converges: multinomial logistic regression on frozen features, by L-BFGS.

The SGD probe of the paper (``LinearProbe`` + SGD, 100 ImageNet epochs) needs many steps; on a few
thousand images it is stopped far from its optimum and its accuracy says more about the optimizer
than about the features. Here the features are standardized (training mean and std), and the
convex objective

    mean_i CE(W x_i + b, y_i) + l2 / 2 * ||W||^2

is minimized by full-batch L-BFGS with a strong-Wolfe line search until the gradient norm falls
below ``tol``. ``l2 = 1 / (C N)`` is scikit-learn's ``LogisticRegression(C=C)`` objective.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['LogisticProbe', 'fit_logistic_probe']


@dataclass
class LogisticProbe:
    """A fitted probe: ``logits = ((x - mean) / std) @ weight.T + bias``.

    Attributes:
        weight (Tensor): (num_classes, D). bias (Tensor): (num_classes,).
        mean, std (Tensor): (D,) training-feature statistics.
        iterations (int): L-BFGS iterations run. grad_norm (float): final gradient norm.
        converged (bool): whether ``grad_norm <= tol`` was reached.
    """
    weight: Tensor
    bias: Tensor
    mean: Tensor
    std: Tensor
    iterations: int
    grad_norm: float
    converged: bool

    def logits(self, feats: Tensor) -> Tensor:
        """(M, D) -> (M, num_classes)."""
        return ((feats.float() - self.mean) / self.std) @ self.weight.T + self.bias

    def predict(self, feats: Tensor) -> Tensor:
        """(M, D) -> (M,) predicted labels."""
        return self.logits(feats).argmax(dim=1)


def fit_logistic_probe(feats: Tensor, labels: Tensor, num_classes: int, l2: float = 1e-3,
                       max_iter: int = 500, tol: float = 1e-5) -> LogisticProbe:
    """Fit multinomial logistic regression on ``feats`` (N, D) with ``labels`` (N,).

    Args:
        feats (Tensor): (N, D) training features (any float dtype; computed in float64).
        labels (Tensor): (N,) labels in ``[0, num_classes)``.
        num_classes (int): number of classes.
        l2 (float): weight decay on ``W`` (not on the bias). Defaults to 1e-3.
        max_iter (int): L-BFGS iterations at most. Defaults to 500.
        tol (float): stop when the gradient's max-norm is below this. Defaults to 1e-5.

    Returns:
        LogisticProbe: the fitted probe (float32 tensors).
    """
    if feats.ndim != 2 or labels.shape != feats.shape[:1]:
        raise ValueError(f'logistic probe: need (N, D) features and (N,) labels, got '
                         f'{tuple(feats.shape)} and {tuple(labels.shape)}')
    if l2 < 0:
        raise ValueError(f'logistic probe: l2={l2} must be >= 0')
    x = feats.detach().double()
    y = labels.detach().long()
    if y.numel() and not 0 <= int(y.min()) <= int(y.max()) < num_classes:
        raise ValueError(f'logistic probe: labels must lie in [0, {num_classes}), got '
                         f'[{int(y.min())}, {int(y.max())}]')
    mean, std = x.mean(0), x.std(0, unbiased=False).clamp_min(1e-6)
    x = (x - mean) / std
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], lr=1, max_iter=max_iter, tolerance_grad=tol,
                            tolerance_change=1e-12, history_size=20,
                            line_search_fn='strong_wolfe')

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ weight.T + bias, y) + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
        closure()
    grad_norm = max(float(weight.grad.abs().max()), float(bias.grad.abs().max()))
    iterations = opt.state[opt._params[0]].get('n_iter', 0)
    return LogisticProbe(weight.detach().float(), bias.detach().float(), mean.float(),
                         std.float(), int(iterations), grad_norm, grad_norm <= tol * 10)
