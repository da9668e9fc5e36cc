"""mmdinomamba: DINO-pretrained Vision Mamba, linear attention and ViT as OpenMMLab plugins.

Importing the package registers every module into mmpretrain's registries. It never imports
Triton or ``mamba_ssm`` eagerly, so it works on a CPU-only machine.
"""
from .version import __version__
from .utils.compat import patch_external_config_scopes
from .utils.quiet import without_onedl_notice

patch_external_config_scopes()
with without_onedl_notice():
    from . import analysis, datasets, engine, evaluation, models  # noqa: F401,E402  (registration)

__all__ = ['__version__']
