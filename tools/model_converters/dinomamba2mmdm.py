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
import os.path as osp
import re
import sys
from collections import OrderedDict

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

VIM_ARCH_BY_WIDTH = {256: 't', 512: 's', 768: 'b'}
#: keys every Dino-Mamba checkpoint has
VIM_KEYS = ('patch_embed.proj.weight', 'pos_embed')


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
    from mmdinomamba.models.utils import backbone_only
    sd, dropped = backbone_only(state_dict)
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
    require_keys(state_dict, VIM_KEYS, source, 'Dino-Mamba')
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


def convert_for_model(state_dict: dict, arch: str | None, source: str) -> tuple:
    """The converter's step of :func:`~mmdinomamba.models.utils.run_converter`: check that the
    weights are a Dino-Mamba model, convert them and infer the ``DinoVim`` / ``MambaReg``
    config.

    Returns:
        tuple: (converted state dict, dropped source keys, model config).
    """
    from mmdinomamba.models.utils import backbone_only, require_keys
    reject_other_model(state_dict, source)
    require_keys(backbone_only(state_dict)[0], VIM_KEYS, source, 'Dino-Mamba')
    converted, dropped, kind = convert_dinomamba(state_dict)
    return converted, dropped, infer_vim_cfg(converted, kind, arch, source)


def main(argv=None) -> int:
    from mmdinomamba.models.backbones import DinoVim, MambaReg
    from mmdinomamba.models.utils import run_converter
    return run_converter(argv, name='dinomamba2mmdm', description=__doc__.split('\n')[0],
                         src_help='official Dino-Mamba checkpoint',
                         arch_help="'t', 's' or 'b' (default: inferred from the width)",
                         convert=convert_for_model,
                         models={'DinoVim': DinoVim, 'MambaReg': MambaReg})


if __name__ == '__main__':
    sys.exit(main())
