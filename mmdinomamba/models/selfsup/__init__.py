"""models/selfsup."""
from .dino import DINO  # noqa: F401
