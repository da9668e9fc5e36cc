"""models/classifiers."""
from .featmap_evaluator import FeatMapEvaluator  # noqa: F401
