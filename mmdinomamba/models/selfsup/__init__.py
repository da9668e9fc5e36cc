"""models/selfsup."""
from .dino import DINO  # noqa: F401
from .dino_data_preprocessor import DINODataPreprocessor  # noqa: F401
from .dino_graphs import CropGraphs  # noqa: F401
