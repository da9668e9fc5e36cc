"""Evaluation: the Binary-AUC metric and its functional core."""
from .auc import exact_auc, minmax_normalize, normalize_auc, resize_mask, roc_curve, sweep_auc
from .binary_auc import BinaryAUC, fill_featmap_samples
from .knn import knn_predict, knn_scores
from .logistic import LogisticProbe, fit_logistic_probe

__all__ = ['BinaryAUC', 'fill_featmap_samples', 'exact_auc', 'sweep_auc', 'normalize_auc', 'roc_curve',
           'minmax_normalize', 'resize_mask', 'knn_scores', 'knn_predict', 'LogisticProbe',
           'fit_logistic_probe']
from .real import ReaLAccuracy  # noqa: F401,E402
from .robustness import RestrictedAccuracy, restrict_predictions  # noqa: F401,E402
