"""datasets/transforms."""
from .mask import LoadFgMask, decode_fg_mask  # noqa: F401
