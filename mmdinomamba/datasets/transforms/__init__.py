"""datasets/transforms."""
from .loading import LoadImageFromFile  # noqa: F401
from .mask import LoadFgMask, decode_fg_mask  # noqa: F401
from .dino import DINOMultiCrop  # noqa: F401
