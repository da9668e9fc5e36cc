"""Take the teacher (or student) backbone out of a DINO checkpoint.

Writes ``{'state_dict': <backbone keys without prefix>, 'meta': {...}}``, loadable by the same
backbone class directly or through ``init_cfg=dict(type='Pretrained', checkpoint=OUT)`` in
linear-probe and downstream configs. DINO evaluates the teacher, the default here.

Example::

    python tools/model_converters/extract_backbone.py work_dirs/dino/epoch_100.pth \\
        dinovim-b_teacher.pth
    python tools/model_converters/extract_backbone.py CKPT OUT --part student
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.models.utils import DINO_BACKBONE_PREFIXES as PREFIXES  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkpoint', help='DINO checkpoint (mmengine .pth)')
    parser.add_argument('out', help='output file (never the input checkpoint)')
    parser.add_argument('--part', choices=sorted(PREFIXES), default='teacher',
                        help='which network to take the backbone from (default: teacher)')
    return parser.parse_args(argv)


def _top_prefixes(keys) -> list:
    """Distinct key prefixes up to two levels, e.g. ['backbone.layers', 'head.mlp', ...]."""
    return sorted({'.'.join(k.split('.')[:2]) for k in keys})


def extract_backbone(state_dict: dict, part: str = 'teacher', source: str = '<state_dict>'):
    """The backbone keys of ``part`` with their prefix stripped (``module.`` removed first);
    the state dict's ``_metadata`` (e.g. the token layout a DinoVim records) follows the keys.

    Raises:
        KeyError: no key of ``state_dict`` has a prefix of ``part``; the message names
            ``source`` and the prefixes that are there.
    """
    if part not in PREFIXES:
        raise ValueError(f'part={part!r} is not one of {sorted(PREFIXES)}')
    from mmdinomamba.models.utils import strip_prefix, strip_wrapper_prefix
    sd = strip_wrapper_prefix(state_dict)
    for prefix in PREFIXES[part]:
        out = strip_prefix(sd, prefix, keep_only=True)
        if out:
            return out, prefix
    raise KeyError(f'{source}: no {part} backbone keys (looked for the prefixes '
                   f'{list(PREFIXES[part])}); the checkpoint has keys starting with '
                   f'{_top_prefixes(sd)[:20]}. Is it a DINO checkpoint?')


def main(argv=None) -> None:
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        sys.exit(f'checkpoint not found: {args.checkpoint}')
    from mmdinomamba.models.utils import (check_output_path, read_checkpoint, save_atomic,
                                          select_state_dict)
    try:
        check_output_path(args.checkpoint, args.out)
        # a damaged or foreign file: one line naming it (CheckpointFileError, a ValueError)
        ckpt = read_checkpoint(args.checkpoint, weights_only=False, log=False)
    except ValueError as err:
        sys.exit(f'error: {err}')
    state_dict = select_state_dict(ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state_dict, dict):
        sys.exit(f'{args.checkpoint}: not a checkpoint dict (got {type(ckpt).__name__})')
    try:
        backbone, prefix = extract_backbone(state_dict, args.part, args.checkpoint)
    except KeyError as e:
        sys.exit(str(e.args[0]))
    meta = dict(source=osp.abspath(args.checkpoint), part=args.part, prefix=prefix,
                num_tensors=len(backbone))
    src_meta = ckpt.get('meta', {}) if isinstance(ckpt, dict) else {}
    for key in ('epoch', 'iter', 'seed', 'mmengine_version'):
        if key in src_meta:
            meta[key] = src_meta[key]
    save_atomic({'state_dict': backbone, 'meta': meta}, args.out)
    n = sum(v.numel() for v in backbone.values() if hasattr(v, 'numel'))
    print(f'{args.part} backbone ({prefix}*): {len(backbone)} tensors, {n / 1e6:.2f}M values '
          f'-> {args.out}')


if __name__ == '__main__':
    main()
