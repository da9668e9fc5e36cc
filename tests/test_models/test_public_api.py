"""The public model classes import from ``mmdinomamba.models`` (as ``mmpretrain.models``) and are
the classes registered under their names."""


def test_models_import_from_the_models_package():
    from mmpretrain.registry import MODELS

    import mmdinomamba.models as models
    from mmdinomamba.models import DINO, MILA, DinoVim, LinearViT, MambaReg, ViT
    for cls in (DINO, MILA, DinoVim, LinearViT, MambaReg, ViT):
        assert MODELS.get(cls.__name__) is cls
    assert all(hasattr(models, name) for name in models.__all__)
