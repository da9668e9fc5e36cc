"""Convert official Dino-Mamba checkpoints (yangtiming/Dino-Mamba) to mmdinomamba keys.

Handles the released DinoVim T/S/B (``models_vim.VisionMamba``) and Mamba-Reg-B
(``models_mambar``) weights, as DINO training checkpoints (``teacher`` / ``student`` entries,
``module.`` and ``backbone.`` prefixes; the DINO projection head and the unused classifier
``head.*`` are dropped) or plain backbone state dicts. Official keys: ``patch_embed.proj.*``,
``cls_token`` (1, 1, C) and ``pos_embed`` (1, 1 + N, C) with the cls position at row 0 (DinoVim)
or ``cls_token`` / ``pos_embed_cls`` (1, 12, C) and a 7x7 ``pos_embed`` (1, 49, C) (Mamba-Reg),
``layers.{i}.norm.weight``, ``layers.{i}.mixer.*`` (Mamba-2 v2), ``norm_f.weight``.

The result loads into ``DinoVim(arch=..., legacy_dinomamba_layout=True)`` (the released token
layout: outputs equal the official model's) or ``MambaReg(arch=..., img_size=112)``; the meta
entry records that config. The weights record their token layout, so loading them into the
clean middle-cls ``DinoVim`` (same parameters, different features) is an error that says to set
``legacy_dinomamba_layout=True``.

Example::

    python tools/model_converters/dinomamba2mmdm.py checkpoint.pth dinovim-b.pth --arch b
    python tools/model_converters/dinomamba2mmdm.py mambar.pth mambareg-b.pth --key student
"""
import argparse
import os.path as osp
import re
import sys
from collections import OrderedDict

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

VIM_ARCH_BY_WIDTH = {256: 't', 512: 's', 768: 'b'}


def _backbone_only(state_dict: dict) -> tuple[OrderedDict, list[str]]:
    """Strip ``module.``; keep only ``backbone.*`` when present. Returns (kept, dropped)."""
    sd = OrderedDict((k[len('module.'):] if k.startswith('module.') else k, v)
                     for k, v in state_dict.items())
    if not any(k.startswith('backbone.') for k in sd):
        return sd, []
    dropped = [k for k in sd if not k.startswith('backbone.')]
    return OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                       if k.startswith('backbone.')), dropped


def _map_layer_key(index: str, rest: str) -> str:
    """``norm.*`` -> ``norm1.*``; mixer keys are unchanged (BiSSD uses the official names:
    in_proj, conv1d(_b), dt_bias / dt_b_bias, A_log(_b), D(_b), norm(_b), out_proj)."""
    if rest.startswith('norm.'):
        return f'layers.{index}.norm1.{rest[len("norm."):]}'
    return f'layers.{index}.{rest}'


def convert_dinomamba(state_dict: dict) -> tuple[OrderedDict, list[str], str]:
    """Map official Dino-Mamba keys to ours.

    DinoVim: ``pos_embed`` row 0 -> ``pos_embed_cls``, rows 1: -> ``pos_embed`` (patch grid).
    Mamba-Reg: ``pos_embed`` (grid), ``pos_embed_cls`` and ``cls_token`` (registers) unchanged.
    Both: ``layers.{i}.norm`` -> ``layers.{i}.norm1``, ``layers.{i}.mixer.*`` unchanged,
    ``norm_f`` -> ``norm``; ``head.*`` dropped. Unknown keys are kept so that
    the key check reports them as unexpected. The token layout of the released model
    (``'legacy_dinomamba'`` / ``'registers'``) is recorded in the state dict's ``_metadata``:
    loading it into a ``DinoVim`` of the other layout is an error that says what to set.

    Returns:
        tuple: (converted state dict, dropped source keys, 'DinoVim' or 'MambaReg').
    """
    sd, dropped = _backbone_only(state_dict)
    kind = 'MambaReg' if 'pos_embed_cls' in sd else 'DinoVim'
    out = OrderedDict()
    for k, v in sd.items():
        layer = re.match(r'layers\.(\d+)\.(.+)$', k)
        if k.startswith('head.'):
            dropped.append(k)
        elif k == 'pos_embed' and kind == 'DinoVim':
            out['pos_embed_cls'], out['pos_embed'] = v[:, :1].clone(), v[:, 1:].clone()
        elif k.startswith('norm_f.'):
            out['norm.' + k[len('norm_f.'):]] = v
        elif layer:
            out[_map_layer_key(layer[1], layer[2])] = v
        else:
            out[k] = v
    from mmdinomamba.models.backbones.layout import (LEGACY_DINOMAMBA, REGISTERS,
                                                     record_token_layout)
    record_token_layout(out, LEGACY_DINOMAMBA if kind == 'DinoVim' else REGISTERS)
    return out, dropped, kind


def reject_other_model(state_dict: dict, source: str) -> None:
    """A DINO ViT checkpoint (``blocks.{i}.attn.*`` keys) given to this converter: say which
    converter it needs instead of failing later on its width."""
    if any(re.search(r'(^|\.)blocks\.\d+\.attn\.', k) for k in state_dict):
        raise ValueError(f'{source} holds a ViT (keys blocks.*.attn.*), not a Dino-Mamba model: '
                         'convert it with tools/model_converters/dino_vit2mmdm.py')


def infer_vim_cfg(state_dict: dict, kind: str, arch: str | None = None,
                  source: str = '<weights>') -> dict:
    """Our model config for converted weights (arch from the width, grid -> img_size)."""
    from mmdinomamba.models.utils import require_keys
    require_keys(state_dict, ('patch_embed.proj.weight', 'pos_embed'), source, 'Dino-Mamba')
    width = state_dict['patch_embed.proj.weight'].shape[0]
    if arch is None:
        if width not in VIM_ARCH_BY_WIDTH:
            raise ValueError(f'{source}: cannot infer the arch from the width {width} (released '
                             f'widths: {VIM_ARCH_BY_WIDTH}); pass --arch')
        arch = VIM_ARCH_BY_WIDTH[width]
    patch = state_dict['patch_embed.proj.weight'].shape[-1]
    side = round(state_dict['pos_embed'].shape[1]**0.5)
    cfg = dict(type=kind, arch=arch, patch_size=patch, img_size=side * patch)
    if kind == 'DinoVim':
        cfg['legacy_dinomamba_layout'] = True
    return cfg


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official Dino-Mamba checkpoint')
    parser.add_argument('dst', help='output file (never the input file)')
    parser.add_argument('--arch', help="'t', 's' or 'b' (default: inferred from the width)")
    parser.add_argument('--key', default=None,
                        help="checkpoint entry with the weights (default: 'teacher' when "
                        'present, else the state_dict / model entry or the plain state dict)')
    parser.add_argument('--allow-missing', action='store_true',
                        help='write the file even if keys are missing or mis-shaped')
    args = parser.parse_args(argv)

    from mmdinomamba.models.backbones import DinoVim, MambaReg
    from mmdinomamba.models.utils import (build_on_meta, check_output_path, compare_keys,
                                          converter_weights, format_key_report, require_keys,
                                          save_atomic)
    try:
        if not osp.isfile(args.src):
            raise ValueError(f'checkpoint not found: {args.src}')
        check_output_path(args.src, args.dst)
        # DINO checkpoints hold argparse Namespaces: trusted input, full unpickling needed.
        ckpt = torch.load(args.src, map_location='cpu', weights_only=False)
        state, key = converter_weights(ckpt, args.key, args.src)
        reject_other_model(state, args.src)
        require_keys(_backbone_only(state)[0], ('patch_embed.proj.weight', 'pos_embed'), args.src,
                     'Dino-Mamba')
        converted, dropped, kind = convert_dinomamba(state)
        cfg = infer_vim_cfg(converted, kind, args.arch, args.src)
    except (KeyError, ValueError) as err:
        print(f'error: {err.args[0]}', file=sys.stderr)
        return 1
    print(f'weights: entry {key!r} of {args.src}' if key else f'weights: {args.src}')
    cls = {'DinoVim': DinoVim, 'MambaReg': MambaReg}[kind]
    model = build_on_meta(lambda: cls(**{k: v for k, v in cfg.items() if k != 'type'}))
    report = compare_keys(model, converted)
    print(format_key_report(report, dropped))
    if (report['missing'] or report['shape_mismatch']) and not args.allow_missing:
        print('not written: fix the keys above or pass --allow-missing', file=sys.stderr)
        return 1
    meta = dict(source=args.src, converter='dinomamba2mmdm', key=key, model_cfg=cfg)
    save_atomic(dict(state_dict=converted, meta=meta), args.dst)
    print(f'wrote {len(converted)} tensors to {args.dst}; model: {cfg}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
