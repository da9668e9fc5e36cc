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
import os.path as osp
import re
import sys
from collections import OrderedDict

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

VIT_ARCH_BY_WIDTH = {384: 's', 768: 'b'}
#: keys every DINO ViT checkpoint has
VIT_KEYS = ('cls_token', 'pos_embed', 'patch_embed.proj.weight')


def convert_dino_vit(state_dict: dict) -> tuple[OrderedDict, list[str]]:
    """Map official DINO ViT keys to ours.

    ``pos_embed`` row 0 (the cls position) becomes ``pos_embed_cls``, rows 1: the patch grid
    ``pos_embed``; ``blocks.{i}.attn.*`` -> ``layers.{i}.mixer.*``; other ``blocks.{i}.*`` ->
    ``layers.{i}.*``; classification/projection heads are dropped. Unknown keys are kept
    unchanged so that the key check reports them as unexpected.

    Returns:
        tuple: (converted state dict, list of dropped source keys).
    """
    from mmdinomamba.models.utils import backbone_only
    sd, dropped = backbone_only(state_dict)
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
    require_keys(state_dict, VIT_KEYS, source, 'DINO ViT')
    width = state_dict['cls_token'].shape[-1]
    if arch is None:
        if width not in VIT_ARCH_BY_WIDTH:
            raise ValueError(f'{source}: cannot infer the arch from the width {width} (released '
                             f'widths: {VIT_ARCH_BY_WIDTH}); pass --arch')
        arch = VIT_ARCH_BY_WIDTH[width]
    patch = state_dict['patch_embed.proj.weight'].shape[-1]
    side = round(state_dict['pos_embed'].shape[1]**0.5)
    return dict(type='ViT', arch=arch, patch_size=patch, img_size=side * patch)


def convert_for_model(state_dict: dict, arch: str | None, source: str) -> tuple:
    """The converter's step of :func:`~mmdinomamba.models.utils.run_converter`: check that the
    weights are a DINO ViT, convert them and infer the ``ViT`` config.

    Returns:
        tuple: (converted state dict, dropped source keys, model config).
    """
    from mmdinomamba.models.utils import backbone_only, require_keys
    reject_other_model(state_dict, source)
    require_keys(backbone_only(state_dict)[0], VIT_KEYS, source, 'DINO ViT')
    converted, dropped = convert_dino_vit(state_dict)
    return converted, dropped, infer_vit_cfg(converted, arch, source)


def main(argv=None) -> int:
    from mmdinomamba.models.backbones import ViT
    from mmdinomamba.models.utils import run_converter
    return run_converter(argv, name='dino_vit2mmdm', description=__doc__.split('\n')[0],
                         src_help='official DINO ViT checkpoint',
                         arch_help="'s' or 'b' (default: inferred from the width)",
                         convert=convert_for_model, models={'ViT': ViT})


if __name__ == '__main__':
    sys.exit(main())
