"""models/classifiers."""
from .featmap_evaluator import FeatMapEvaluator  # noqa: F401
from .linear_probe import LinearProbe  # noqa: F401
