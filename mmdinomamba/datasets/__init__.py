"""Datasets and transforms (registered in mmpretrain's registries)."""
from . import transforms  # noqa: F401
from .embedded import EmbeddedShapes, generate_embedded_dataset  # noqa: F401
from .folder import ImageFolderWithMasks, check_folder_layout, read_classes  # noqa: F401
from .imagenet_s import ImageNetS  # noqa: F401
from .imagenet_variants import ImageNetReaL, ImageNetVariant  # noqa: F401
