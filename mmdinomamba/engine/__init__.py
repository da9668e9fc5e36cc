"""Engine: hooks."""
from . import hooks  # noqa: F401
