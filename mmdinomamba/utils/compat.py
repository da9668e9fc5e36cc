"""Compatibility shims for the installed OpenMMLab stack.

The maintained OpenMMLab releases we pin are published as ``onedl-mmsegmentation`` and
``onedl-mmdetection`` (import names ``mmseg`` / ``mmdet``). mmengine resolves ``mmseg::`` config
bases through the *distribution* name ``mmsegmentation``, which does not exist under that name,
so ``_base_ = ['mmseg::...']`` fails with "mmsegmentation is not installed". We point mmengine's
scope table at the import name when (and only when) the distribution name is missing but the
module imports; mmengine then finds the package (and its ``.mim`` configs) through ``find_spec``.

The same table must name ``mmdinomamba`` for ``_base_ = ['mmdinomamba::seg/...']`` (mmengine
refuses a scope it does not list). Both entries exist once ``mmdinomamba`` is imported; the
shipped configs do not depend on them (they use no ``mmseg::`` base and inherit each other by
relative path), so they load in an interpreter that has not imported the package.
"""
import importlib.util

_PATCHED = False
#: our own scope: ``mmdinomamba::<folder>/<config>.py`` reads ``mmdinomamba/.mim/configs``
OWN_SCOPE = 'mmdinomamba'


def _dist_installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version
    try:
        version(name)
        return True
    except PackageNotFoundError:
        return False


def patch_external_config_scopes() -> None:
    """Make ``mmseg::``, ``mmdet::``, ``mmpretrain::`` and ``mmdinomamba::`` config bases
    resolve (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    from mmengine.config import utils as cfg_utils
    for scope in ('mmseg', 'mmdet', 'mmpretrain'):
        package = cfg_utils.MODULE2PACKAGE.get(scope, scope)
        if _dist_installed(package):
            continue
        if importlib.util.find_spec(scope) is not None:
            cfg_utils.MODULE2PACKAGE[scope] = scope
    cfg_utils.MODULE2PACKAGE.setdefault(OWN_SCOPE, OWN_SCOPE)
    _PATCHED = True
