"""Helpers shared by the tools: ``--cfg-options`` parsing, config loading with clear errors."""
import difflib
import os.path as osp
from typing import Any, Dict, List, Optional

from mmengine.config import Config, ConfigDict
from mmengine.config import DictAction as _MMEngineDictAction

from .compat import patch_external_config_scopes

patch_external_config_scopes()


def _split_top_level(text: str) -> List[str]:
    """Split ``text`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in '([':
            depth += 1
        elif char in ')]':
            depth -= 1
        if depth < 0:
            raise ValueError(f'--cfg-options: unbalanced brackets in {text!r}')
        if char == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f'--cfg-options: unbalanced brackets in {text!r}')
    parts.append(text[start:])
    return parts


class DictAction(_MMEngineDictAction):
    """mmengine's ``DictAction`` (``KEY=VALUE``, ``KEY=V1,V2``, ``KEY=[(V1,V2),V3]``) that keeps
    every value as given: mmengine deletes all spaces, so ``data_root='/data/my set'`` became
    ``/data/myset``. Here spaces inside a value are kept (only those around list elements are
    dropped), and a value in quotes is taken as a string as it is (``KEY='1,2'`` is ``'1,2'``).
    """

    @staticmethod
    def _parse_iterable(val: str) -> Any:
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in '\'"':
            return val[1:-1]
        is_tuple = val.startswith('(') and val.endswith(')')
        if is_tuple or (val.startswith('[') and val.endswith(']')):
            val = val[1:-1]
        elif ',' not in val:
            return _MMEngineDictAction._parse_int_float_bool(val)
        parts = _split_top_level(val)
        if parts and not parts[-1].strip():  # trailing comma: "a,"
            parts = parts[:-1]
        values = [DictAction._parse_iterable(p) for p in parts]
        return tuple(values) if is_tuple else values


def _flat_keys(cfg, prefix=''):
    keys = set()
    for k, v in cfg.items():
        name = f'{prefix}{k}'
        keys.add(name)
        if isinstance(v, (dict, ConfigDict)):
            keys |= _flat_keys(v, name + '.')
    return keys


def _has_path(cfg, dotted: str) -> bool:
    node = cfg._cfg_dict if isinstance(cfg, Config) else cfg  # a Config is not a dict
    for part in dotted.split('.'):
        if isinstance(node, (dict, ConfigDict)) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def check_cfg_options(cfg: Config, options: Optional[Dict], allow_new_keys: bool = False):
    """Raise ``KeyError`` for a ``--cfg-options`` key that is not in the config.

    A typo such as ``train_cfg.max_iter=10`` would otherwise silently add a key nobody reads.
    Keys under a ``type``-d dict may still be added with ``allow_new_keys``.
    """
    if not options or allow_new_keys:
        return
    known = sorted(_flat_keys(cfg))
    for key in options:
        if _has_path(cfg, key):
            continue
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        hint = f' Did you mean: {", ".join(close)}?' if close else ''
        raise KeyError(
            f'--cfg-options: unknown config key {key!r} (not in {cfg.filename}).{hint} '
            'Pass --allow-new-keys to add a key that the config does not define.')


def load_config(path: str, options: Optional[Dict] = None,
                allow_new_keys: bool = False) -> Config:
    """Load ``path`` with clear errors and merge ``options`` (checked by
    :func:`check_cfg_options`)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    check_cfg_options(cfg, options, allow_new_keys)
    if options:
        cfg.merge_from_dict(options)
    return cfg


def check_data_roots(cfg: Config) -> None:
    """Fail early, naming the path, when a dataloader's ``data_root`` does not exist.

    Datasets that generate their data (``EmbeddedShapes`` and the embedded seg/det sets) are
    skipped: they create their folder on first use.
    """
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(name)
        if not loader:
            continue
        dataset = loader.get('dataset', {})
        while isinstance(dataset, dict) and 'dataset' in dataset:  # wrappers
            dataset = dataset['dataset']
        if not isinstance(dataset, dict):
            continue
        if 'Embedded' in str(dataset.get('type', '')):
            continue
        root = dataset.get('data_root')
        if root and not osp.isdir(root):
            raise FileNotFoundError(
                f'{name}.dataset.data_root={root!r} does not exist. Point it at your data with '
                f'--cfg-options {name}.dataset.data_root=/path/to/data (see README "Data").')
