"""Models: token mixers, backbones, DINO, heads, necks and classifiers."""
from . import backbones, classifiers, heads, mixers, necks, selfsup  # noqa: F401
