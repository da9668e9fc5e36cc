"""The package's model index, registered with mmpretrain's model zoo on ``import mmdinomamba``.

OpenMMLab packages ship ``<package>/.mim/{configs,tools,model-index.yml}``; mmpretrain's
``ModelHub`` reads its own index and any index registered with
``ModelHub.register_model_index``. Registering ours makes ``mmpretrain.list_models``,
``get_model``, ``inference_model``, ``ImageClassificationInferencer`` and ``FeatureExtractor``
know the models of ``configs/*/metafile.yml`` (configs only: no weights are published).
"""
import os.path as osp
import warnings

_REGISTERED = []


def mim_dir() -> str:
    """The package's ``.mim`` folder (links to the repository's folders in a checkout, copies
    in a wheel), resolved to its real path."""
    return osp.realpath(osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), '.mim'))


def register_model_index() -> bool:
    """Register ``.mim/model-index.yml`` with mmpretrain's ``ModelHub`` (once a process).

    Returns:
        bool: whether the index is registered. False, with a warning naming the file, for an
        install without the ``.mim`` folder (the package itself still works).
    """
    if _REGISTERED:
        return True
    index = osp.join(mim_dir(), 'model-index.yml')
    if not osp.isfile(index):
        warnings.warn(f'mmdinomamba: {index} is missing, so mmpretrain.list_models() does not '
                      'list the models of mmdinomamba (install the package from a wheel or a '
                      'checkout, which carry the .mim folder)')
        return False
    from mmpretrain.apis import ModelHub
    ModelHub.register_model_index(index, config_prefix=mim_dir())
    _REGISTERED.append(index)
    return True
