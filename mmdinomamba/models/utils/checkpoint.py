"""Checkpoint helpers: picking and strictly loading weights (converters: :mod:`.converter`).

Every loader of this package goes through :func:`backbone_state_dict` (pick a backbone's tensors
out of a checkpoint by prefix) and :func:`load_state_dict_checked` (a strict load whose error
names the file, the prefix and the keys at fault). A state dict's ``_metadata`` (the per-module
``local_metadata`` PyTorch passes to ``_load_from_state_dict``, e.g. the token layout a
:class:`~mmdinomamba.models.backbones.DinoVim` records) travels with its keys when a prefix is
removed or added.
"""
import re
from collections import OrderedDict
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from . import checkpoint_file  # noqa: F401  (mmengine's local loads name bad files)

__all__ = [
    'select_state_dict', 'strip_prefix', 'add_prefix', 'compare_keys', 'format_key_report',
    'build_on_meta', 'CheckpointMismatchError', 'backbone_state_dict', 'load_state_dict_checked',
    'load_backbone_checkpoint', 'init_weights_strict', 'split_pretrained_cfg',
    'load_checkpoint_strict', 'strip_wrapper_prefix', 'DINO_BACKBONE_PREFIXES',
    'BACKBONE_PREFIXES'
]

#: how many keys of each kind an error message lists
MAX_KEYS_SHOWN = 10

#: where a DINO checkpoint of this package keeps each network's backbone (``teacher.module.``:
#: a teacher saved from inside a wrapper)
DINO_BACKBONE_PREFIXES = {
    'teacher': ('teacher.backbone.', 'teacher.module.backbone.'),
    'student': ('backbone.', ),
}
#: every prefix a backbone may sit under, in order of preference: the teacher first, as DINO
#: evaluates the teacher
BACKBONE_PREFIXES = DINO_BACKBONE_PREFIXES['teacher'] + DINO_BACKBONE_PREFIXES['student']


class CheckpointMismatchError(RuntimeError):
    """The weights of a checkpoint do not fit the model they are loaded into."""


def select_state_dict(ckpt: dict, key: str | None = None) -> dict:
    """Pick the weights out of a loaded checkpoint.

    Args:
        ckpt (dict): what ``torch.load`` returned: a plain state dict, or a dict holding one
            under ``key`` (e.g. DINO's ``'teacher'`` / ``'student'``) or ``'state_dict'`` /
            ``'model'``.
        key (str, optional): the entry to use; None picks ``'state_dict'``, ``'model'`` or the
            dict itself (when its values are tensors). Defaults to None.

    Raises:
        KeyError: when ``key`` is missing (the message lists the available entries).
    """
    if key is not None:
        if key not in ckpt:
            raise KeyError(f'checkpoint has no entry {key!r}; available: {sorted(ckpt)[:20]}')
        return ckpt[key]
    for k in ('state_dict', 'model'):
        if k in ckpt and isinstance(ckpt[k], dict):
            return ckpt[k]
    return ckpt


def _metadata_under(metadata: dict, prefix: str) -> OrderedDict:
    """The ``_metadata`` entries of the modules under ``prefix`` (ending in '.'), re-keyed."""
    out = OrderedDict()
    for k, v in metadata.items():
        if k == prefix[:-1]:
            out[''] = v
        elif k.startswith(prefix):
            out[k[len(prefix):]] = v
    return out


def strip_prefix(state_dict: dict, prefix: str, keep_only: bool = False) -> OrderedDict:
    """Remove ``prefix`` from keys that start with it (``_metadata`` follows the keys).

    Args:
        keep_only (bool): drop the keys without the prefix (e.g. keep only ``backbone.*`` of a
            DINO checkpoint, dropping its projection head). Defaults to False.
    """
    out = OrderedDict()
    for k, v in state_dict.items():
        if k.startswith(prefix):
            out[k[len(prefix):]] = v
        elif not keep_only:
            out[k] = v
    metadata = getattr(state_dict, '_metadata', None)
    if metadata is not None:
        out._metadata = OrderedDict() if keep_only else OrderedDict(
            (k, v) for k, v in metadata.items() if k != prefix[:-1] and not k.startswith(prefix))
        out._metadata.update(_metadata_under(metadata, prefix) if prefix.endswith('.') else
                             metadata)
    return out


def strip_wrapper_prefix(state_dict: dict) -> OrderedDict:
    """Remove the ``module.`` that a DDP / FSDP wrapper puts before every key."""
    return strip_prefix(state_dict, 'module.')


def add_prefix(state_dict: dict, prefix: str) -> OrderedDict:
    """Put ``prefix`` (ending in '.') before every key (``_metadata`` follows the keys)."""
    out = OrderedDict((prefix + k, v) for k, v in state_dict.items())
    metadata = getattr(state_dict, '_metadata', None)
    if metadata is not None:
        out._metadata = OrderedDict(
            ((prefix + k) if k else prefix[:-1], v) for k, v in metadata.items())
    return out


def compare_keys(model: nn.Module, state_dict: dict) -> dict:
    """Compare a converted state dict with a model's.

    Returns:
        dict: ``missing`` (model keys absent from the state dict), ``unexpected`` (extra keys)
        and ``shape_mismatch`` (``key: (got, want)``) lists.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatch = {
        k: (tuple(v.shape), tuple(own[k].shape))
        for k, v in state_dict.items() if k in own and isinstance(v, Tensor)
        and tuple(v.shape) != tuple(own[k].shape)
    }
    return dict(missing=missing, unexpected=unexpected, shape_mismatch=mismatch)


def format_key_report(report: dict, dropped: list[str] = ()) -> str:
    """A readable multi-line summary of :func:`compare_keys` (plus deliberately dropped keys)."""
    lines = []
    for name in ('missing', 'unexpected', 'shape_mismatch'):
        items = report[name]
        lines.append(f'{name} keys: {len(items)}')
        for k in items:
            lines.append(f'  {k}' + (f': got {items[k][0]}, want {items[k][1]}'
                                     if name == 'shape_mismatch' else ''))
    if dropped:
        lines.append(f'dropped (not backbone) keys: {len(dropped)} '
                     f'(e.g. {", ".join(list(dropped)[:4])})')
    return '\n'.join(lines)


def build_on_meta(build_fn):
    """Build a model on the meta device (no memory, no init cost); fall back to CPU."""
    try:
        with torch.device('meta'):
            return build_fn()
    except (NotImplementedError, RuntimeError):
        return build_fn()


# ---- picking a backbone out of a checkpoint ----------------------------------------------
def _normalize_prefix(prefix: Optional[str]) -> str:
    if not prefix:
        return ''
    return prefix if prefix.endswith('.') else prefix + '.'


def _top_names(keys: Iterable[str]) -> list:
    return sorted({k.split('.')[0] for k in keys})[:MAX_KEYS_SHOWN]


def backbone_state_dict(state_dict: dict, own_keys: Iterable[str],
                        prefixes: Optional[str | Sequence[str]] = None,
                        source: str = '<state_dict>') -> tuple[OrderedDict, str]:
    """Pick a backbone's tensors out of a checkpoint's state dict.

    The keys under the first of ``prefixes`` that any key has (prefix removed). When none has
    one, the file is taken as a backbone-only file (written by ``extract_backbone.py`` or a
    converter): all of its keys if they all start with ``backbone.`` (prefix removed), else
    its bare keys when some of them are keys of the backbone. The strict load that follows
    reports every key that does not fit.

    Args:
        state_dict (dict): the checkpoint's state dict.
        own_keys (Iterable[str]): the backbone's state-dict keys.
        prefixes (str | Sequence[str], optional): e.g. ``'teacher.backbone.'`` (the trailing
            dot may be left out); None or '' means bare keys. Defaults to None.
        source (str): the file, for messages. Defaults to '<state_dict>'.

    Returns:
        tuple: (the backbone's state dict, with ``_metadata``; the prefix used).

    Raises:
        KeyError: nothing in ``state_dict`` looks like the backbone's weights; the message names
            ``source``, the prefixes and the top-level names the checkpoint has.
    """
    if prefixes is None or isinstance(prefixes, str):
        prefixes = [prefixes]
    prefixes = [_normalize_prefix(p) for p in prefixes]
    for prefix in prefixes:
        if prefix and any(k.startswith(prefix) for k in state_dict):
            return strip_prefix(state_dict, prefix, keep_only=True), prefix
    if state_dict and all(k.startswith('backbone.') for k in state_dict):
        return strip_prefix(state_dict, 'backbone.', keep_only=True), 'backbone.'
    if set(state_dict) & set(own_keys):
        return strip_prefix(state_dict, '', keep_only=True), ''
    shown = [p for p in prefixes if p] or ['(none)']
    raise KeyError(f'{source} has no keys under the prefix {" or ".join(map(repr, shown))} '
                   f'and is not a backbone-only file (its keys start with '
                   f'{_top_names(state_dict)}); set the prefix of the backbone weights '
                   "(e.g. 'teacher.backbone.' for a DINO checkpoint)")


# ---- strict loading --------------------------------------------------------------------------
def _load_collecting(module: nn.Module, state_dict: dict) -> tuple[list, list, list]:
    """``module.load_state_dict`` that collects instead of raising.

    Returns:
        tuple: (missing keys, unexpected keys, other errors such as shape mismatches).
    """
    missing, unexpected, errors = [], [], []
    metadata = getattr(state_dict, '_metadata', None)
    state_dict = OrderedDict(state_dict)
    if metadata is not None:
        state_dict._metadata = metadata

    def load(mod, local, prefix=''):
        local_metadata = {} if metadata is None else metadata.get(prefix[:-1], {})
        mod._load_from_state_dict(local, prefix, local_metadata, True, missing, unexpected,
                                  errors)
        for name, child in mod._modules.items():
            if child is not None:
                sub = prefix + name + '.'
                load(child, {k: v for k, v in local.items() if k.startswith(sub)}, sub)
        incompatible = _IncompatibleKeys(missing, unexpected)
        for hook in mod._load_state_dict_post_hooks.values():
            hook(mod, incompatible)

    load(module, state_dict)
    return missing, unexpected, errors


def _listed(keys: Sequence[str]) -> str:
    more = len(keys) - MAX_KEYS_SHOWN
    return ', '.join(keys[:MAX_KEYS_SHOWN]) + (f' (+{more} more)' if more > 0 else '')


def _where(source: str, prefix: Optional[str]) -> str:
    return source + ('' if prefix is None else f' (prefix {prefix!r})')


def load_state_dict_checked(module: nn.Module, state_dict: dict, source: str,
                            prefix: Optional[str] = None, optional: Sequence[str] = (),
                            hint: str = '') -> list:
    """Load ``state_dict`` into ``module`` strictly, with an error that says what is wrong.

    Missing keys matching one of the ``optional`` regular expressions (documented exceptions:
    parts the checkpoint legitimately lacks, left as initialized) and BatchNorm's
    ``num_batches_tracked`` are not errors. Position embeddings of another grid are resized by
    the backbones themselves on load.

    Args:
        module (nn.Module): the model.
        state_dict (dict): its weights (keys relative to ``module``).
        source (str): the checkpoint file, named in messages.
        prefix (str, optional): the prefix the keys were taken from, named in messages.
        optional (Sequence[str]): regular expressions of keys that may be missing.
        hint (str): a last sentence for the error (what to do). Defaults to ''.

    Returns:
        list: the optional keys that were missing.

    Raises:
        CheckpointMismatchError: keys missing, unexpected or of another shape, or a check of the
            model rejected the weights (e.g. another token layout); the message names ``source``,
            ``prefix``, the model and up to ten keys of each kind.
    """
    name = type(module).__name__
    try:
        missing, unexpected, errors = _load_collecting(module, state_dict)
    except CheckpointMismatchError as err:
        raise CheckpointMismatchError(f'{name}: the weights in {_where(source, prefix)} cannot '
                                      f'be used: {err}') from None
    skipped = [k for k in missing if any(re.search(p, k) for p in optional)]
    missing = [k for k in missing if k not in skipped and 'num_batches_tracked' not in k]
    if not (missing or unexpected or errors):
        return skipped
    lines = [f'{name}: the weights in {_where(source, prefix)} do not fit this model:']
    if missing:
        lines.append(f'  missing keys ({len(missing)}): {_listed(missing)}')
    if unexpected:
        lines.append(f'  unexpected keys ({len(unexpected)}): {_listed(unexpected)}')
    for err in errors[:MAX_KEYS_SHOWN]:
        lines.append('  ' + str(err).strip().replace('\n', ' '))
    if len(errors) > MAX_KEYS_SHOWN:
        lines.append(f'  (+{len(errors) - MAX_KEYS_SHOWN} more errors)')
    lines.append(hint or 'Check that the config (type, arch, patch_size, ...) is that of the '
                 'checkpoint, and the prefix of the weights in it.')
    raise CheckpointMismatchError('\n'.join(lines))


def split_pretrained_cfg(init_cfg) -> tuple[Optional[dict], Optional[dict | list]]:
    """Split an mmengine ``init_cfg`` into its ``Pretrained`` entry and the rest.

    Raises:
        ValueError: more than one ``Pretrained`` entry.
        UnknownArgumentError: a key of the ``Pretrained`` entry that mmengine's initializer
            does not take (e.g. ``prefx``), named with the closest valid keys.
    """
    cfgs = [] if init_cfg is None else [init_cfg] if isinstance(init_cfg, dict) else \
        list(init_cfg)
    pretrained = [c for c in cfgs if c.get('type') == 'Pretrained']
    others = [c for c in cfgs if c.get('type') != 'Pretrained']
    if len(pretrained) > 1:
        raise ValueError(f'init_cfg has {len(pretrained)} Pretrained entries; give one')
    if pretrained:  # a typo (``prefx=``) would otherwise be ignored, and the prefix be none
        from mmengine.model.weight_init import PretrainedInit

        from mmdinomamba.utils.cfg_check import INIT_CONSUMED, check_keys
        check_keys('init_cfg', pretrained[0], PretrainedInit, INIT_CONSUMED, required=False)
    rest = None if not others else others[0] if len(others) == 1 else others
    return (dict(pretrained[0]) if pretrained else None), rest


def load_backbone_checkpoint(backbone: nn.Module, path: str,
                             prefix: Optional[str | Sequence[str]] = None) -> tuple[int, str, list]:
    """Load a backbone's weights from a checkpoint file, strictly.

    Keys matching the backbone's ``optional_pretrained_keys`` (regular expressions; e.g. the
    extra stage norms of a hierarchical backbone) may be missing: they keep their init.

    Args:
        backbone (nn.Module): the backbone.
        path (str): a checkpoint: a DINO / classifier checkpoint (keys under ``prefix``) or a
            backbone-only file (see :func:`backbone_state_dict`).
        prefix (str | Sequence[str], optional): where the backbone's keys are, e.g.
            ``'teacher.backbone.'`` (several: the first present).

    Returns:
        tuple: (number of tensors loaded, the prefix used, the optional keys that were missing).

    Raises:
        KeyError: no backbone weights in the file (see :func:`backbone_state_dict`).
        CheckpointMismatchError: they do not fit (see :func:`load_state_dict_checked`).
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state = _with_recorded_layout(select_state_dict(ckpt), ckpt)
    state, used = backbone_state_dict(state, backbone.state_dict().keys(), prefix, path)
    skipped = load_state_dict_checked(backbone, state, path, used,
                                      getattr(backbone, 'optional_pretrained_keys', ()))
    return len(state), used, skipped


def init_weights_strict(module: nn.Module, base_init: Callable[[], None]) -> None:
    """``init_weights`` of a backbone whose ``Pretrained`` init_cfg is loaded strictly.

    mmengine's ``Pretrained`` initializer loads non-strictly (a mismatch is one warning among
    the log lines and the model trains on random weights). Here ``base_init`` (the backbone's
    own initialization: mmengine's ``BaseModule.init_weights`` with the other init_cfg entries,
    then any preset init) runs first, then the checkpoint is loaded with
    :func:`load_backbone_checkpoint`.

    Raises:
        ValueError: the ``Pretrained`` entry has no checkpoint.
        KeyError, CheckpointMismatchError: see :func:`load_backbone_checkpoint`.
    """
    pretrained, rest = split_pretrained_cfg(module.init_cfg)
    if pretrained is None or getattr(module, '_is_init', False):
        base_init()
        return
    name, original = type(module).__name__, module.init_cfg
    path = pretrained.get('checkpoint')
    if not path:
        raise ValueError(f'{name}: init_cfg {pretrained} has no checkpoint; set '
                         'init_cfg.checkpoint to a file, or init_cfg=None for random weights')
    module.init_cfg = rest
    try:
        base_init()
    finally:
        module.init_cfg = original
    count, used, skipped = load_backbone_checkpoint(module, path, pretrained.get('prefix'))
    from mmengine.logging import print_log
    print_log(f'{name}: loaded {count} tensors from {path} (prefix {used!r}), strictly' +
              (f'; not in the checkpoint, kept as initialized: {skipped}' if skipped else ''),
              logger='current')


def _with_recorded_layout(state_dict: dict, ckpt: dict) -> dict:
    """Files converted before the token layout was recorded in the weights: take it from the
    converter's ``meta.model_cfg`` (``legacy_dinomamba_layout=True``)."""
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    cfg = meta.get('model_cfg') if isinstance(meta, dict) else None
    if not (isinstance(cfg, dict) and cfg.get('legacy_dinomamba_layout')):
        return state_dict
    from ..backbones.layout import LEGACY_DINOMAMBA, LAYOUT_METADATA_KEY, record_token_layout
    metadata = getattr(state_dict, '_metadata', None) or {}
    if any(LAYOUT_METADATA_KEY in v for v in metadata.values()):
        return state_dict
    state_dict = OrderedDict(state_dict)
    state_dict._metadata = OrderedDict(metadata)
    record_token_layout(state_dict, LEGACY_DINOMAMBA)
    return state_dict


def load_checkpoint_strict(model: nn.Module, path: str) -> None:
    """Strictly load the checkpoint ``path`` into a whole model (``tools/test.py``: mmengine's
    runner loads non-strictly, so a checkpoint of another model would be tested as a random one).

    The model's own load hooks run (e.g. ``FeatMapEvaluator`` picking the teacher backbone of a
    DINO checkpoint); ``module.`` prefixes are removed as mmengine's runner does.

    Raises:
        CheckpointMismatchError: the checkpoint does not fit; the message names ``path`` and
            the keys at fault.
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    from mmpretrain.utils import get_ori_model
    model = get_ori_model(model)
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state = strip_wrapper_prefix(_with_recorded_layout(select_state_dict(ckpt), ckpt))
    hint = ''
    if any(k.startswith('teacher.') for k in state):
        hint = ('It looks like a DINO pretraining checkpoint: it has no trained head for this '
                'model. Train one first (e.g. a linear probe: configs/linear_probe, its '
                'backbone.init_cfg.checkpoint set to this file) and test that checkpoint; '
                'Binary-AUC configs (configs/analysis) take DINO checkpoints directly.')
    load_state_dict_checked(model, state, path, hint=hint)
