"""Analysis: CLS-to-patch feature maps, their Binary-AUC (``FeatMapEvaluator``, the frozen-backbone
evaluations of the hooks), PCA, off-diagonal rank of M, plots.

``plots`` (matplotlib) is not imported here; use ``from mmdinomamba.analysis import plots``.
"""
from .backbone_eval import backbone_features, evaluate_binary_auc
from .featmap_evaluator import FeatMapEvaluator
from .featmaps import (FeatMaps, compute_featmaps, cosine_maps, mixing_maps, query_tokens,
                       resolve_query)
from .pca import pca_rgb, principal_components

__all__ = ['FeatMaps', 'compute_featmaps', 'cosine_maps', 'mixing_maps', 'query_tokens',
           'resolve_query', 'pca_rgb', 'principal_components', 'backbone_features',
           'evaluate_binary_auc', 'FeatMapEvaluator']
