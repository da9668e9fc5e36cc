"""The arguments of hooks, loops and weight initializers checked before the runner is built.

mmengine builds a hook from its config when the runner is made, but a ``CheckpointHook``
forwards unknown keys to ``Runner.save_checkpoint``, so ``max_keep_ckpt=1`` (for
``max_keep_ckpts``) failed only at the first save, after a whole epoch; an ``init_cfg`` key with
a typo was never read at all. :func:`check_runner_args` compares every key of ``default_hooks``,
``custom_hooks``, ``train_cfg`` / ``val_cfg`` / ``test_cfg`` and every ``init_cfg`` of the model
with the signature of the class it configures and names the unknown key and the closest valid
ones, as the ``--cfg-options`` check does.
"""
import difflib
import inspect
from typing import Iterable, List, Optional

from mmengine.config import Config

__all__ = ['check_runner_args', 'accepted_keys', 'check_keys', 'UnknownArgumentError']

#: keys that the runner or ``initialize`` read themselves, never passed to the class
CONSUMED = {'type', 'priority', '_scope_'}
#: arguments the runner fills in for loops (never given in the config)
LOOP_INJECTED = {'runner', 'dataloader', 'evaluator'}
#: keys of an initializer config that mmengine's ``initialize`` reads itself
INIT_CONSUMED = {'type', 'override', 'name', '_scope_'}


class UnknownArgumentError(KeyError):
    """A config key that the class it configures does not take."""

    def __str__(self) -> str:
        return str(self.args[0])


def _params(func) -> tuple[list, bool]:
    """(named parameters after ``self``, whether it takes ``**kwargs``)."""
    params = list(inspect.signature(func).parameters.values())[1:]
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


def accepted_keys(cls) -> Optional[set]:
    """The keyword arguments ``cls(...)`` takes, or None when they cannot be known.

    ``**kwargs`` is followed up the class's MRO (a subclass passing them on to its base's
    ``__init__``); mmengine's ``CheckpointHook`` passes them to ``Runner.save_checkpoint``,
    whose free arguments are added instead.
    """
    from mmengine.hooks import CheckpointHook
    from mmengine.runner import Runner
    keys = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        if klass is object:
            return None  # **kwargs that reach object: accepted by nothing we can see
        named, var_kw = _params(init)
        keys |= {p.name for p in named}
        if not var_kw:
            return keys
        if klass is CheckpointHook:
            saved, _ = _params(Runner.save_checkpoint)
            return keys | ({p.name for p in saved} - {'out_dir', 'filename'})
    return None


def _required(cls) -> List[str]:
    init = getattr(cls, '__init__', None)
    if init is None or init is object.__init__:
        return []
    named, _ = _params(init)
    return [p.name for p in named if p.default is p.empty]


def check_keys(where: str, cfg: dict, cls, consumed: Iterable[str] = CONSUMED,
               injected: Iterable[str] = (), required: bool = True) -> None:
    """Raise :class:`UnknownArgumentError` for a key of ``cfg`` that ``cls`` does not take,
    naming ``where`` (e.g. ``default_hooks.checkpoint``), the key, the closest valid keys and
    all of them; and (``required``) for a required argument that is missing."""
    valid = accepted_keys(cls)
    if valid is None:
        return
    valid -= set(injected)
    name = getattr(cls, '__name__', str(cls))
    for key in cfg:
        if key in consumed or key in valid:
            continue
        close = difflib.get_close_matches(key, sorted(valid), n=3, cutoff=0.6)
        hint = f' Did you mean: {", ".join(close)}?' if close else ''
        raise UnknownArgumentError(
            f'{where}: unknown argument {key!r} of {name}.{hint} Its arguments: '
            f'{", ".join(sorted(valid)) or "(none)"}')
    if not required:
        return
    missing = [k for k in _required(cls) if k not in cfg and k not in set(injected)]
    if missing:
        raise UnknownArgumentError(f'{where}: {name} needs the argument(s) {missing}, which '
                                   'the config does not give')


def _lookup(registry, type_, scope: Optional[str], where: str):
    if not isinstance(type_, str):
        return type_
    with registry.switch_scope_and_registry(scope) as reg:
        cls = reg.get(type_)
    if cls is None:
        names = sorted(set(registry.module_dict) | set(reg.module_dict))
        close = difflib.get_close_matches(type_, names, n=3, cutoff=0.6)
        hint = f' Did you mean: {", ".join(close)}?' if close else ''
        raise UnknownArgumentError(f'{where}: unknown type {type_!r} (not registered in the '
                                   f'{registry.name} registry of scope {scope!r}).{hint}')
    return cls


def _hook_cfgs(cfg: Config) -> list:
    """(where, hook config) of every hook the runner will build."""
    found = []
    for name, hook in (cfg.get('default_hooks') or {}).items():
        if isinstance(hook, dict):
            found.append((f'default_hooks.{name}', hook))
    for i, hook in enumerate(cfg.get('custom_hooks') or []):
        if isinstance(hook, dict):
            found.append((f'custom_hooks[{i}] ({hook.get("type")})', hook))
    return found


def _check_hooks(cfg: Config, scope: Optional[str]) -> None:
    from mmengine.registry import HOOKS
    for where, hook in _hook_cfgs(cfg):
        if 'type' not in hook:
            raise UnknownArgumentError(f'{where} has no type')
        check_keys(where, hook, _lookup(HOOKS, hook['type'], scope, where))


def _default_loop(name: str, loop: dict):
    from mmengine.runner import (EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop)
    if name == 'train_cfg':
        return EpochBasedTrainLoop if loop.get('by_epoch', True) else IterBasedTrainLoop
    return ValLoop if name == 'val_cfg' else TestLoop


def _check_loops(cfg: Config, scope: Optional[str]) -> None:
    from mmengine.registry import LOOPS
    for name in ('train_cfg', 'val_cfg', 'test_cfg'):
        loop = cfg.get(name)
        if not isinstance(loop, dict) or not loop:
            continue
        if 'type' in loop:
            cls, consumed = _lookup(LOOPS, loop['type'], scope, name), CONSUMED
        else:
            cls, consumed = _default_loop(name, loop), CONSUMED | {'by_epoch'}
        check_keys(name, loop, cls, consumed, LOOP_INJECTED)


def _init_cfgs(node, where: str):
    """(where, initializer config) of every ``init_cfg`` under ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f'{where}.{key}'
            if key == 'init_cfg':
                items = value if isinstance(value, (list, tuple)) else [value]
                for i, item in enumerate(items):
                    if isinstance(item, dict) and 'type' in item:
                        yield (sub if len(items) == 1 else f'{sub}[{i}]'), item
            else:
                yield from _init_cfgs(value, sub)
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _init_cfgs(item, f'{where}[{i}]')


def _check_init_cfgs(cfg: Config, scope: Optional[str]) -> None:
    from mmengine.registry import WEIGHT_INITIALIZERS
    model = cfg.get('model')
    if not isinstance(model, dict):
        return
    for where, init in _init_cfgs(model, 'model'):
        cls = _lookup(WEIGHT_INITIALIZERS, init['type'], scope, where)
        check_keys(where, init, cls, INIT_CONSUMED)


def check_runner_args(cfg: Config) -> None:
    """Check the hooks, loops and initializers of ``cfg`` before the runner is built.

    Raises:
        UnknownArgumentError: a key that the hook / loop / initializer class does not take
            (the message names the config entry, the key, the closest valid keys and all of
            them), a required argument missing, or a ``type`` that is not registered.
    """
    scope = cfg.get('default_scope')
    _check_hooks(cfg, scope)
    _check_loops(cfg, scope)
    _check_init_cfgs(cfg, scope)
