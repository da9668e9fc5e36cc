"""mmdinomamba: DINO-pretrained Vision Mamba, linear attention and ViT as OpenMMLab plugins.

Importing the package registers every module into mmpretrain's registries (mmseg's and mmdet's
with ``mmdinomamba.downstream``), the configs' scope ``mmdinomamba::`` with mmengine, and the
model index (``.mim/model-index.yml``) with mmpretrain's model zoo, so that
``mmpretrain.list_models('*dinovim*')`` and ``get_model`` know our models. It never imports
Triton or ``mamba_ssm`` eagerly, so it works on a CPU-only machine.
"""
from .version import __version__
from .utils.compat import patch_external_config_scopes
from .utils.quiet import without_onedl_notice

patch_external_config_scopes()
with without_onedl_notice():
    from . import analysis, datasets, engine, evaluation, models  # noqa: F401,E402  (registration)
from .utils.model_index import register_model_index  # noqa: E402

register_model_index()

__all__ = ['__version__']
