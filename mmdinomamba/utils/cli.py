"""Helpers shared by the tools: ``--cfg-options`` parsing, config loading with clear errors."""
import difflib
import gc
import json
import logging
import math
import os
import os.path as osp
import pickle
from datetime import timedelta
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from mmengine.config import Config, ConfigDict
from mmengine.config import DictAction as _MMEngineDictAction
from mmengine.dist import is_main_process
from mmengine.logging import print_log

from .compat import drop_own_scope_marks, patch_external_config_scopes
from .files import write_bytes_atomic, write_text_atomic

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
    drop_own_scope_marks(cfg)  # bases inherited as mmdinomamba::... build in default_scope
    check_cfg_options(cfg, options, allow_new_keys)
    if options:
        cfg.merge_from_dict(options)
    return cfg


def check_data_roots(cfg: Config) -> None:
    """Fail early, naming the path, when a dataloader's ``data_root`` does not exist.

    The embedded data sets (``EmbeddedShapes`` and the embedded seg/det sets) are skipped: they
    check their folder themselves (an error naming it and the command that writes it, unless
    built with ``generate=True``).
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
                f'{name}.dataset.data_root={root!r} does not exist (resolved: '
                f'{osp.abspath(root)}). Point it at your data with '
                f'--cfg-options {name}.dataset.data_root=/path/to/data (see README "Data").')


OUT_FORMATS = ('.json', '.pkl')


def check_out_path(path: str) -> None:
    """Fail at start, naming the problem, when the metrics file ``--out`` could not be written
    (rather than after the whole evaluation): the extension must be ``.json`` or ``.pkl`` and
    the folder must exist and be writable."""
    ext = osp.splitext(path)[1].lower()
    if ext not in OUT_FORMATS:
        raise ValueError(f'--out {path!r}: the file must end with .json or .pkl '
                         f'(got {ext or "no extension"})')
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f'--out {path!r}: the folder {folder} does not exist; create '
                                'it or choose another path')
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f'--out {path!r}: the folder {folder} is not writable')
    if osp.isdir(path):
        raise IsADirectoryError(f'--out {path!r} is a folder; give a file name')


def _plain(value):
    """``value`` with numpy scalars / arrays as Python numbers / lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _non_finite_to_none(value, key: str, found: List[str]):
    if isinstance(value, dict):
        return {k: _non_finite_to_none(v, f'{key}{k}', found) for k, v in value.items()}
    if isinstance(value, list):
        return [_non_finite_to_none(v, f'{key}[{i}]', found) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        found.append(key)
        return None
    return value


def dump_metrics(metrics: dict, path: str) -> None:
    """Write ``metrics`` to ``path`` (``.json`` or ``.pkl``) through a scratch file, on the main
    process only.

    JSON has no NaN: a NaN or infinite metric (e.g. Binary-AUC when every mask is all foreground)
    is written as ``null``, and a warning names those metrics and the skipped image counts.
    """
    if not is_main_process():
        return
    metrics = _plain(dict(metrics))
    if osp.splitext(path)[1].lower() == '.pkl':
        write_bytes_atomic(path, pickle.dumps(metrics), 'the metrics (--out)')
        return
    found: List[str] = []
    clean = _non_finite_to_none(metrics, '', found)
    if found:
        counts = {k: v for k, v in metrics.items()
                  if k.endswith(('skipped', 'num_images')) and isinstance(v, int)}
        detail = f' ({", ".join(f"{k}={v}" for k, v in counts.items())})' if counts else ''
        print_log(f'--out: {len(found)} metric(s) are not numbers and are written as null in '
                  f'{path}: {", ".join(found)}{detail}', logger='current',
                  level=logging.WARNING)
    write_text_atomic(path, json.dumps(clean, indent=2, allow_nan=False) + '\n',
                      'the metrics (--out)')


def setup_cpu_distributed(cfg: Config) -> None:
    """Let a distributed launch (``tools/dist_train.sh`` / ``dist_test.sh``) run on CPUs.

    Without CUDA, the ``gloo`` backend replaces ``nccl``; for ``--launcher pytorch`` the process
    group is initialized here, since mmengine's ``init_dist`` first calls
    ``torch.cuda.set_device``, which fails without a driver; and the DDP wrapper gets
    ``device_ids=None`` (a CPU module takes no device ids). Nothing changes with CUDA or without
    a launcher.
    """
    if cfg.get('launcher', 'none') == 'none' or torch.cuda.is_available():
        return
    env_cfg = cfg.setdefault('env_cfg', ConfigDict())
    dist_cfg = env_cfg.setdefault('dist_cfg', ConfigDict())
    dist_cfg['backend'] = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or ConfigDict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    if 'DistributedDataParallel' in str(wrapper.get('type', 'MMDistributedDataParallel')):
        wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    if cfg.launcher == 'pytorch' and not torch.distributed.is_initialized():
        kwargs = {k: v for k, v in dist_cfg.items() if k != 'backend'}
        if kwargs.get('timeout') is not None:
            kwargs['timeout'] = timedelta(seconds=kwargs['timeout'])
        torch.distributed.init_process_group(backend='gloo', **kwargs)


def keep_freed_memory_on_cpu() -> bool:
    """On a machine without CUDA, let the process keep freed CPU memory for reuse
    (:func:`~mmdinomamba.utils.cpu_memory.keep_freed_cpu_memory`): eager CPU training allocates the same
    large temporaries every step, and glibc otherwise hands them back to the system and pays
    page faults to get them again. The demo model's DINO step measured 1.25x faster with it
    (``tools/analysis/benchmark.py --modes dino`` with and without ``--keep-freed-memory``);
    peak memory is unchanged. ``MMDINOMAMBA_KEEP_FREED_MEMORY=0`` turns it off.

    Returns:
        bool: whether the setting was applied.
    """
    if torch.cuda.is_available() or os.environ.get('MMDINOMAMBA_KEEP_FREED_MEMORY', '1') == '0':
        return False
    from mmdinomamba.utils.cpu_memory import keep_freed_cpu_memory
    return keep_freed_cpu_memory()


def finish_distributed() -> None:
    """End a distributed run cleanly: wait for every process, then destroy the process group.

    A ``gloo`` group left to the interpreter's exit can abort a process while its threads are
    torn down (``terminate called without an active exception``), failing a run that finished.
    Call it after dropping the runner: the garbage collection here then frees what still holds
    the group (the DDP wrapper and its reducer), so the group is really destroyed now, while the
    interpreter is whole. A no-op without a process group.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        gc.collect()
        torch.distributed.destroy_process_group()


TENSORBOARD_BACKEND = dict(type='TensorboardVisBackend')


def add_tensorboard(cfg: Config) -> None:
    """``--tensorboard``: add mmengine's ``TensorboardVisBackend`` to the config's visualizer.

    Everything the runner's visualizer receives then also goes to TensorBoard event files in
    ``<work_dir>/<timestamp>/vis_data/``: the logged losses and scalars (DINO's
    ``teacher_entropy``, ``teacher_batch_entropy``, ``prototypes_used``, the learning rate, ...),
    the metrics, and what hooks add (``BinaryAUCHook``: Binary-AUC per layer and the map figures
    as images). View them with ``tensorboard --logdir <work_dir>``.

    Raises:
        ImportError: the ``tensorboard`` package is not installed (the message says how to
            install it).
    """
    import importlib.util
    if importlib.util.find_spec('tensorboard') is None:
        raise ImportError('--tensorboard needs the tensorboard package, which is not installed: '
                          'pip install tensorboard (or pip install -e ".[tensorboard]"; '
                          'tools/setup_env.sh installs it)')
    if cfg.get('visualizer') is None:
        cfg.visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])
    backends = list(cfg.visualizer.get('vis_backends') or [])
    if not any(b.get('type') == TENSORBOARD_BACKEND['type'] for b in backends):
        backends.append(dict(TENSORBOARD_BACKEND))
    cfg.visualizer.vis_backends = backends
