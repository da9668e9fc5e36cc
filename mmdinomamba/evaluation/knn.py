"""Weighted k-NN classification of frozen features (DINO's ``eval_knn``).

Caron et al., ICCV 2021 (https://arxiv.org/abs/2104.14294), Section 4.1 and the official
``knn_classifier``: features are L2-normalized, the ``k`` training features of highest cosine
similarity vote for their class with weight ``exp(similarity / T)``, and the class of the largest
summed weight wins (k = 20, T = 0.07 in DINO).
"""
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['knn_scores', 'knn_predict']


@torch.no_grad()
def knn_scores(train_feats: Tensor, train_labels: Tensor, test_feats: Tensor,
               num_classes: int, k: int = 20, temperature: float = 0.07,
               chunk_size: int = 1024) -> Tensor:
    """Per-class vote of the ``k`` nearest training features for every test feature.

    Args:
        train_feats (Tensor): (N, D) training (memory bank) features; normalized here.
        train_labels (Tensor): (N,) integer labels in ``[0, num_classes)``.
        test_feats (Tensor): (M, D) features to classify; normalized here.
        num_classes (int): number of classes.
        k (int): neighbours that vote. Defaults to 20 (clipped to N).
        temperature (float): vote weight ``exp(cos / temperature)``. Defaults to 0.07.
        chunk_size (int): test features per similarity block (memory bound). Defaults to 1024.

    Returns:
        Tensor: (M, num_classes) summed vote weights.
    """
    if train_feats.ndim != 2 or test_feats.ndim != 2 or \
            train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(f'knn: need (N, D) and (M, D) features, got {tuple(train_feats.shape)} '
                         f'and {tuple(test_feats.shape)}')
    if train_labels.shape != train_feats.shape[:1]:
        raise ValueError(f'knn: {train_feats.shape[0]} training features but labels of shape '
                         f'{tuple(train_labels.shape)}')
    if k < 1 or temperature <= 0:
        raise ValueError(f'knn: need k >= 1 and temperature > 0, got k={k}, '
                         f'temperature={temperature}')
    labels = train_labels.long()
    if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise ValueError(f'knn: training labels must lie in [0, {num_classes}), got '
                         f'[{int(labels.min())}, {int(labels.max())}]')
    bank = F.normalize(train_feats.float(), dim=1)
    k = min(k, bank.shape[0])
    out = []
    for start in range(0, test_feats.shape[0], chunk_size):
        q = F.normalize(test_feats[start:start + chunk_size].float(), dim=1)
        sim, idx = (q @ bank.T).topk(k, dim=1)
        votes = torch.zeros(q.shape[0], num_classes, dtype=sim.dtype, device=sim.device)
        votes.scatter_add_(1, labels.to(idx.device)[idx], (sim / temperature).exp())
        out.append(votes)
    return torch.cat(out) if out else torch.zeros(0, num_classes)


def knn_predict(train_feats: Tensor, train_labels: Tensor, test_feats: Tensor,
                num_classes: int, k: int = 20, temperature: float = 0.07) -> Tensor:
    """(M,) predicted labels; see :func:`knn_scores`. Ties go to the lowest class index."""
    return knn_scores(train_feats, train_labels, test_feats, num_classes, k,
                      temperature).argmax(dim=1)
