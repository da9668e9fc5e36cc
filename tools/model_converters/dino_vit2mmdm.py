"""Convert an official DINO ViT checkpoint (facebookresearch/dino) to mmdinomamba's ``ViT`` keys.

Accepts the released backbone-only files (``dino_deitsmall16_pretrain.pth``,
``dino_vitbase16_pretrain.pth``: keys ``cls_token``, ``pos_embed`` (1, 1 + N, C),
``patch_embed.proj.*``, ``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*``,
``norm.*``) and full training checkpoints (``teacher`` / ``student`` entries with ``module.`` and
``backbone.`` prefixes; the teacher is read when present, the DINO projection head is
dropped). Writes
``{'state_dict': ..., 'meta': ...}`` loadable by ``ViT(arch=...)`` (or via
``init_cfg=dict(type='Pretrained', checkpoint=DST)``).

Example::

    python tools/model_converters/dino_vit2mmdm.py dino_vitbase16_pretrain.pth vit-b16_dino.pth
    python tools/model_converters/dino_vit2mmdm.py full_ckpt.pth out.pth --key teacher --arch s
"""
import argparse
import os.path as osp
import re
import sys
from collections import OrderedDict

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

VIT_ARCH_BY_WIDTH = {384: 's', 768: 'b'}


def _backbone_only(state_dict: dict) -> tuple[OrderedDict, list[str]]:
    """Strip ``module.``; keep only ``backbone.*`` when present. Returns (kept, dropped)."""
    sd = OrderedDict((k[len('module.'):] if k.startswith('module.') else k, v)
                     for k, v in state_dict.items())
    if not any(k.startswith('backbone.') for k in sd):
        return sd, []
    dropped = [k for k in sd if not k.startswith('backbone.')]
    return OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                       if k.startswith('backbone.')), dropped


def convert_dino_vit(state_dict: dict) -> tuple[OrderedDict, list[str]]:
    """Map official DINO ViT keys to ours.

    ``pos_embed`` row 0 (the cls position) becomes ``pos_embed_cls``, rows 1: the patch grid
    ``pos_embed``; ``blocks.{i}.attn.*`` -> ``layers.{i}.mixer.*``; other ``blocks.{i}.*`` ->
    ``layers.{i}.*``; classification/projection heads are dropped. Unknown keys are kept
    unchanged so that the key check reports them as unexpected.

    Returns:
        tuple: (converted state dict, list of dropped source keys).
    """
    sd, dropped = _backbone_only(state_dict)
    out = OrderedDict()
    for k, v in sd.items():
        block = re.match(r'blocks\.(\d+)\.(.+)$', k)
        if k.startswith('head.'):
            dropped.append(k)
        elif k == 'pos_embed':
            out['pos_embed_cls'], out['pos_embed'] = v[:, :1].clone(), v[:, 1:].clone()
        elif block:
            rest = block[2]
            rest = 'mixer.' + rest[len('attn.'):] if rest.startswith('attn.') else rest
            out[f'layers.{block[1]}.{rest}'] = v
        else:
            out[k] = v
    return out, dropped


def reject_other_model(state_dict: dict, source: str) -> None:
    """A Dino-Mamba checkpoint (``layers.{i}.mixer.*``, ``norm_f``) given to this converter: say
    which converter it needs instead of failing later on its keys or width."""
    if any(re.search(r'(^|\.)(layers\.\d+\.mixer\.|norm_f\.)', k) for k in state_dict):
        raise ValueError(f'{source} holds a Dino-Mamba model (keys layers.*.mixer.*, norm_f), '
                         'not a DINO ViT: convert it with '
                         'tools/model_converters/dinomamba2mmdm.py')


def infer_vit_cfg(state_dict: dict, arch: str | None = None, source: str = '<weights>') -> dict:
    """Our ``ViT`` config from converted weights (width -> arch, patch size, image size)."""
    from mmdinomamba.models.utils import require_keys
    require_keys(state_dict, ('cls_token', 'pos_embed', 'patch_embed.proj.weight'), source,
                 'DINO ViT')
    width = state_dict['cls_token'].shape[-1]
    if arch is None:
        if width not in VIT_ARCH_BY_WIDTH:
            raise ValueError(f'{source}: cannot infer the arch from the width {width} (released '
                             f'widths: {VIT_ARCH_BY_WIDTH}); pass --arch')
        arch = VIT_ARCH_BY_WIDTH[width]
    patch = state_dict['patch_embed.proj.weight'].shape[-1]
    side = round(state_dict['pos_embed'].shape[1]**0.5)
    return dict(type='ViT', arch=arch, patch_size=patch, img_size=side * patch)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official DINO ViT checkpoint')
    parser.add_argument('dst', help='output file (never the input file)')
    parser.add_argument('--arch', help="'s' or 'b' (default: inferred from the width)")
    parser.add_argument('--key', default=None,
                        help="checkpoint entry holding the weights (default: 'teacher' when "
                        'present, else the state_dict / model entry or the plain state dict)')
    parser.add_argument('--allow-missing', action='store_true',
                        help='write the file even if keys are missing or mis-shaped')
    args = parser.parse_args(argv)

    from mmdinomamba.models.backbones import ViT
    from mmdinomamba.models.utils import (build_on_meta, check_output_path, compare_keys,
                                          converter_weights, format_key_report, require_keys,
                                          save_atomic)
    try:
        if not osp.isfile(args.src):
            raise ValueError(f'checkpoint not found: {args.src}')
        check_output_path(args.src, args.dst)
        # Official checkpoints hold argparse Namespaces: trusted input, full unpickling needed.
        ckpt = torch.load(args.src, map_location='cpu', weights_only=False)
        state, key = converter_weights(ckpt, args.key, args.src)
        reject_other_model(state, args.src)
        require_keys(_backbone_only(state)[0], ('cls_token', 'pos_embed',
                                                'patch_embed.proj.weight'), args.src, 'DINO ViT')
        converted, dropped = convert_dino_vit(state)
        cfg = infer_vit_cfg(converted, args.arch, args.src)
    except (KeyError, ValueError) as err:
        print(f'error: {err.args[0]}', file=sys.stderr)
        return 1
    print(f'weights: entry {key!r} of {args.src}' if key else f'weights: {args.src}')
    model = build_on_meta(lambda: ViT(**{k: v for k, v in cfg.items() if k != 'type'}))
    report = compare_keys(model, converted)
    print(format_key_report(report, dropped))
    if (report['missing'] or report['shape_mismatch']) and not args.allow_missing:
        print('not written: fix the keys above or pass --allow-missing', file=sys.stderr)
        return 1
    meta = dict(source=args.src, converter='dino_vit2mmdm', key=key, model_cfg=cfg)
    save_atomic(dict(state_dict=converted, meta=meta), args.dst)
    print(f'wrote {len(converted)} tensors to {args.dst}; model: {cfg}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
