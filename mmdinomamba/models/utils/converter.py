"""The one flow of the checkpoint converters (``tools/model_converters/``), and its helpers.

A converter reads the weights out of a checkpoint (:func:`converter_weights`), maps the keys
(its own ``convert`` function, which also names the model the weights are for), compares them
with that model built on the meta device, prints the report and writes
``{'state_dict': ..., 'meta': ...}`` atomically, never over its input
(:func:`run_converter`).
"""
import argparse
import os
import os.path as osp
import sys
from collections import OrderedDict
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .checkpoint import (_top_names, build_on_meta, compare_keys, format_key_report,
                         select_state_dict, strip_wrapper_prefix)
from .checkpoint_file import read_checkpoint

__all__ = ['converter_weights', 'require_keys', 'backbone_only', 'check_output_path',
           'save_atomic', 'run_converter']

#: ``convert(state_dict, arch, source) -> (converted, dropped keys, model config)``; the model
#: config holds the registered backbone ``type`` and its keyword arguments
ConvertFn = Callable[[dict, Optional[str], str], tuple]


def converter_weights(ckpt, key: Optional[str], source: str) -> tuple[dict, Optional[str]]:
    """The state dict a converter reads from a loaded checkpoint, and the entry it came from.

    ``key`` None picks ``'teacher'`` when present (DINO evaluates the teacher), else the
    ``state_dict`` / ``model`` entry or the checkpoint itself (see :func:`select_state_dict`).

    Raises:
        KeyError: ``key`` is not an entry of the checkpoint.
        ValueError: what was picked is not a state dict. Both messages name ``source`` and the
            entries the checkpoint has.
    """
    if not isinstance(ckpt, dict):
        raise ValueError(f'{source} is not a checkpoint dict (got {type(ckpt).__name__})')
    if key is None and isinstance(ckpt.get('teacher'), dict):
        key = 'teacher'
    if key is not None and key not in ckpt:
        raise KeyError(f'{source} has no entry {key!r}; its entries: {sorted(ckpt)[:20]}')
    state = select_state_dict(ckpt, key)
    tensors = isinstance(state, dict) and state and all(
        isinstance(v, Tensor) for v in state.values())
    if not tensors:
        raise ValueError(f'{source}: entry {key!r} is not a state dict of tensors; the '
                         f'checkpoint has the entries {sorted(ckpt)[:20]} (choose one with --key)')
    return state, key


def require_keys(state_dict: dict, keys: Sequence[str], source: str, what: str) -> None:
    """Raise ``KeyError`` naming ``source``, the missing ``keys`` and the keys that are there."""
    missing = [k for k in keys if k not in state_dict]
    if missing:
        raise KeyError(f'{source}: the weights have no {missing}, so they are not a {what} '
                       f'backbone; their keys start with {_top_names(state_dict)} (e.g. '
                       f'{sorted(state_dict)[:5]})')


def backbone_only(state_dict: dict) -> tuple[OrderedDict, list[str]]:
    """An official checkpoint's backbone: ``module.`` removed, then only the ``backbone.*`` keys
    (prefix removed) when there are any, else every key.

    Returns:
        tuple: (the backbone's keys, the dropped keys: DINO's projection head and the like).
    """
    sd = strip_wrapper_prefix(state_dict)
    if not any(k.startswith('backbone.') for k in sd):
        return sd, []
    dropped = [k for k in sd if not k.startswith('backbone.')]
    return OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                       if k.startswith('backbone.')), dropped


def check_output_path(src: str, dst: str) -> None:
    """Refuse to write ``dst`` over the input ``src`` (same path, link or spelling).

    Raises:
        ValueError: ``dst`` is ``src``; or the folder of ``dst`` does not exist.
    """
    same = osp.realpath(src) == osp.realpath(dst) or (
        osp.exists(dst) and osp.exists(src) and osp.samefile(src, dst))
    if same:
        raise ValueError(f'refusing to overwrite the input checkpoint {src} with the output '
                         f'{dst}: choose another output path')
    folder = osp.dirname(osp.abspath(dst))
    if not osp.isdir(folder):
        raise ValueError(f'output folder does not exist: {folder}')


def save_atomic(obj, dst: str) -> None:
    """``torch.save`` to a temporary file next to ``dst``, then rename it into place, so that
    ``dst`` is never left half written (and an existing ``dst`` stays intact on failure). Out
    of space or permission: a ``WorkDirWriteError`` naming ``dst``."""
    from mmdinomamba.utils.files import explain_write_errors
    folder, name = osp.split(osp.abspath(dst))
    tmp = osp.join(folder, f'.{name}.{os.getpid()}.tmp')
    try:
        with explain_write_errors(dst, 'the converted weights'):
            torch.save(obj, tmp)
            os.replace(tmp, dst)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def _parse_converter_args(argv, description: str, src_help: str, arch_help: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('src', help=src_help)
    parser.add_argument('dst', help='output file (never the input file)')
    parser.add_argument('--arch', help=arch_help)
    parser.add_argument('--key', default=None,
                        help="checkpoint entry holding the weights (default: 'teacher' when "
                        'present, else the state_dict / model entry or the plain state dict)')
    parser.add_argument('--allow-missing', action='store_true',
                        help='write the file even if keys are missing or mis-shaped')
    return parser.parse_args(argv)


def _read_and_convert(args, convert: ConvertFn) -> tuple:
    """Load ``args.src`` and convert it: (converted, dropped, model config, entry used)."""
    if not osp.isfile(args.src):
        raise ValueError(f'checkpoint not found: {args.src}')
    check_output_path(args.src, args.dst)
    # Official checkpoints hold argparse Namespaces: trusted input, full unpickling needed.
    # A damaged or foreign file is a CheckpointFileError (a ValueError) naming it.
    ckpt = read_checkpoint(args.src, weights_only=False, log=False)
    state, key = converter_weights(ckpt, args.key, args.src)
    converted, dropped, cfg = convert(state, args.arch, args.src)
    return converted, dropped, cfg, key


def run_converter(argv, *, name: str, description: str, src_help: str, arch_help: str,
                  convert: ConvertFn, models: dict) -> int:
    """Command line of a converter: ``SRC DST [--arch A] [--key K] [--allow-missing]``.

    Reads the weights of ``SRC`` (entry ``--key``, default the teacher when there is one),
    converts them with ``convert``, prints the key report against the model they are for and
    writes ``{'state_dict', 'meta': {source, converter, key, model_cfg}}`` to ``DST`` unless keys
    are missing or mis-shaped (``--allow-missing`` writes anyway).

    Args:
        argv (list[str], optional): the arguments (None: ``sys.argv[1:]``).
        name (str): the converter, recorded in the meta entry.
        description (str): first line of ``--help``.
        src_help (str): what ``SRC`` is. arch_help (str): the ``--arch`` choices.
        convert (ConvertFn): the key mapping (see :data:`ConvertFn`); ``KeyError`` and
            ``ValueError`` it raises are printed as errors.
        models (dict): backbone classes by the ``type`` names ``convert`` may return.

    Returns:
        int: 0 when written, 1 on an error (printed to stderr, nothing written).
    """
    args = _parse_converter_args(argv, description, src_help, arch_help)
    try:
        converted, dropped, cfg, key = _read_and_convert(args, convert)
    except (KeyError, ValueError) as err:
        print(f'error: {err.args[0]}', file=sys.stderr)
        return 1
    print(f'weights: entry {key!r} of {args.src}' if key else f'weights: {args.src}')
    cls = models[cfg['type']]
    model = build_on_meta(lambda: cls(**{k: v for k, v in cfg.items() if k != 'type'}))
    report = compare_keys(model, converted)
    print(format_key_report(report, dropped))
    if (report['missing'] or report['shape_mismatch']) and not args.allow_missing:
        print('not written: fix the keys above or pass --allow-missing', file=sys.stderr)
        return 1
    meta = dict(source=args.src, converter=name, key=key, model_cfg=cfg)
    try:
        save_atomic(dict(state_dict=converted, meta=meta), args.dst)
    except OSError as err:  # out of space or permission: names the file (nothing written)
        print(f'error: {err}', file=sys.stderr)
        return 1
    print(f'wrote {len(converted)} tensors to {args.dst}; model: {cfg}')
    return 0
