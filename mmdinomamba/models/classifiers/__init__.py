"""models/classifiers."""
from .linear_probe import LinearProbe  # noqa: F401
