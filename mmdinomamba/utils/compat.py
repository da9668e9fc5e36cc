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


def drop_own_scope_marks(cfg) -> int:
    """Remove the ``_scope_='mmdinomamba'`` marks of a config that inherits ``mmdinomamba::``.

    mmengine marks the dicts of a ``scope::`` base with that scope, to build them in the
    scope's registries. mmdinomamba has none of its own (its modules are registered into
    mmpretrain's, mmseg's and mmdet's), so under that mark nothing would be found; without it
    the dicts are built under the config's ``default_scope``, exactly as when the base is
    inherited by path. ``tools/train.py`` and ``tools/test.py`` (``utils.cli.load_config``) call
    this after loading.

    Args:
        cfg (mmengine.Config): the loaded config, changed in place.

    Returns:
        int: the number of marks removed.
    """
    removed = 0

    def walk(node):
        nonlocal removed
        if isinstance(node, dict):
            if node.get('_scope_') == OWN_SCOPE:
                del node['_scope_']
                removed += 1
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(cfg._cfg_dict)
    return removed
