"""Helpers shared by the checkpoint converters (``tools/model_converters/``)."""
from collections import OrderedDict

import torch
from torch import Tensor, nn

__all__ = [
    'select_state_dict', 'strip_prefix', 'compare_keys', 'format_key_report', 'build_on_meta'
]


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


def strip_prefix(state_dict: dict, prefix: str, keep_only: bool = False) -> OrderedDict:
    """Remove ``prefix`` from keys that start with it.

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
