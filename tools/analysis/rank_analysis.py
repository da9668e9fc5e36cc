"""Block-rank analysis of the token-mixing matrices M of backbones (paper Sec. 3, Eq. 12-17).

For every model, image, analyzed layer and head, ``M`` restricted to the patch tokens (cls /
register tokens dropped: 1024 tokens at 512 px) is cut into C x C blocks (C = 256 -> 4 x 4) and
the numerical rank (s > rel_tol * s_max), an absolute-tolerance rank (s > abs_tol) and the
entropy effective rank of each block are reported, in two views, labeled in every output:
'causal (paper Eq. 12)' (L_Attn o M for attention, the forward scan for Mamba) and
'as used (bidirectional)' (the non-causal / bidirectional M the backbone applies). For Mamba the
decay mask L_M is analyzed too, and the Eq. 16 bound rank(L_M^off) * N is given per block.

By default only 4 evenly spaced layers and 4 evenly spaced heads are analyzed (CPU budget:
base models at 512 px in minutes on 2 cores); use ``--layers all --max-heads 0`` for everything.

Examples:
    python tools/analysis/rank_analysis.py vit-b linearvit-b dinovim-b --random-init \\
        --img-size 512 --num-images 2 --out-dir work_dirs/rank_analysis
    python tools/analysis/rank_analysis.py configs/pretrain/CONFIG.py --checkpoint CKPT.pth \\
        --embedded --num-images 4
"""
import argparse
import glob
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mmdinomamba.analysis.rank_model import analyze_layer, capture_mixer_inputs  # noqa: E402
from mmdinomamba.analysis.rank_report import (aggregate, format_table, hierarchy_lines,  # noqa
                                              plot_rank_per_layer, plot_spectra, write_csv)

from mmdinomamba.models.backbones.presets import BACKBONE_PRESETS as PRESETS  # noqa: E402
IMG_EXT = ('.png', '.jpg', '.jpeg', '.bmp')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('models', nargs='+', help=f'presets ({", ".join(PRESETS)}) or config files')
    p.add_argument('--checkpoint', nargs='*', default=[], help='one per model (config order)')
    p.add_argument('--ckpt-prefix', default='auto', help="state-dict prefix of the backbone "
                   "('auto': the teacher's, the student's or none, first that matches)")
    p.add_argument('--random-init', action='store_true', help='allow configs without '
                   '--checkpoint (random init; presets are always allowed)')
    src = p.add_mutually_exclusive_group()
    src.add_argument('--images', help='folder of images (searched recursively)')
    src.add_argument('--embedded', nargs='?', const='data/embedded', help='embedded data root '
                     '(val split; generated with default parameters if missing)')
    p.add_argument('--num-images', type=int, default=2, help='images (synthetic noise if no '
                   'source is given)')
    p.add_argument('--img-size', type=int, default=512, help='square input side in px '
                   '(default: %(default)s = 1024 patch tokens at patch 16)')
    p.add_argument('--block-size', type=int, default=256, help='block side C (default: '
                   '%(default)s, the paper\'s chunk size)')
    p.add_argument('--rel-tol', type=float, default=1e-6, help='numerical rank counts '
                   's > rel_tol * s_max (default: %(default)g)')
    p.add_argument('--abs-tol', type=float, default=1e-8, help='rank_abs counts s > abs_tol '
                   '(default: %(default)g)')
    p.add_argument('--layers', nargs='+', default=None,
                   help="layer indices (negative allowed) or 'all'; default 4 evenly spaced")
    p.add_argument('--max-heads', type=int, default=4, help='evenly spaced heads; 0 = all')
    p.add_argument('--dtype', choices=['float64', 'float32'], default='float64',
                   help='model precision (float64: no float32 noise floor in the spectra)')
    p.add_argument('--seed', type=int, default=0, help='seed of the random init and the '
                   'synthetic images (default: %(default)s)')
    p.add_argument('--out-dir', default='work_dirs/rank_analysis', help='CSV and plots go '
                   'here (default: %(default)s)')
    return p.parse_args(argv)


def load_weights(backbone, path: str, prefix: str) -> None:
    """Load ``path`` into ``backbone`` strictly (errors name the file, prefix and keys)."""
    from mmdinomamba.models.utils import BACKBONE_PREFIXES, load_backbone_checkpoint
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    prefixes = BACKBONE_PREFIXES if prefix == 'auto' else (prefix, )
    load_backbone_checkpoint(backbone, path, prefixes)


def build_backbone(spec: str, checkpoint, args):
    """A preset name or a config path (``model.backbone`` or ``model``) -> eval backbone."""
    from mmpretrain.registry import MODELS

    import mmdinomamba  # noqa: F401  (registers the modules)
    if spec in PRESETS:
        cfg = dict(PRESETS[spec])
    elif osp.isfile(spec):
        from mmengine.config import Config
        model = Config.fromfile(spec).model
        cfg = dict(model.get('backbone', model))
    else:
        raise ValueError(f'{spec!r} is neither a preset ({", ".join(PRESETS)}) nor a config file')
    if checkpoint is None and spec not in PRESETS and not args.random_init:
        raise ValueError(f'{spec}: give --checkpoint or --random-init')
    cfg.pop('init_cfg', None)
    backbone = MODELS.build(cfg)
    if checkpoint:
        load_weights(backbone, checkpoint, args.ckpt_prefix)
    dtype = torch.float64 if args.dtype == 'float64' else torch.float32
    if dtype == torch.float64 and getattr(backbone, 'residual_in_fp32', False):
        backbone.residual_in_fp32 = False  # keep the whole residual stream in float64
    return backbone.to(dtype).eval()


def load_images(args) -> list:
    """(3, S, S) float tensors normalized with the ImageNet mean / std."""
    size, n = args.img_size, args.num_images
    if args.images is None and args.embedded is None:
        g = torch.Generator().manual_seed(args.seed)
        raw = [torch.rand(3, size, size, generator=g) * 255 for _ in range(n)]
    else:
        from PIL import Image
        root = args.images
        if args.embedded is not None:
            if not osp.isfile(osp.join(args.embedded, 'meta.json')):
                from mmdinomamba.datasets.embedded import generate_embedded_dataset
                generate_embedded_dataset(args.embedded)
            root = osp.join(args.embedded, 'val')
        files = sorted(f for f in glob.glob(osp.join(root, '**', '*'), recursive=True)
                       if f.lower().endswith(IMG_EXT))[:n]
        if not files:
            raise FileNotFoundError(f'no images ({"/".join(IMG_EXT)}) under {root}')
        raw = [torch.from_numpy(np.asarray(
            Image.open(f).convert('RGB').resize((size, size), Image.BILINEAR), dtype=np.float32)
        ).permute(2, 0, 1) for f in files]
    from mmdinomamba.datasets.normalization import IMAGENET_MEAN, IMAGENET_STD
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return [(x - mean) / std for x in raw]


def pick(n: int, k, name: str) -> list:
    """``k`` evenly spaced indices of ``range(n)`` (k <= 0 or None: all)."""
    if not k or k >= n:
        return list(range(n))
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, k)})


def resolve_layers(layers, num_layers: int) -> list:
    if layers is None:
        return pick(num_layers, 4, 'layers')
    if layers == ['all']:
        return list(range(num_layers))
    out = []
    for s in layers:
        i = int(s)
        if not -num_layers <= i < num_layers:
            raise ValueError(f'--layers: {i} out of range for {num_layers} layers')
        out.append(i % num_layers)
    return sorted(set(out))


def analyze_model(name, backbone, images, args, pbar):
    """Per-block records and spectra of one backbone over all images and selected layers."""
    layer_ids = resolve_layers(args.layers, backbone.num_layers)
    mixers = {i: backbone.layers[i].mixer for i in layer_ids}
    records, spectra = [], {}
    for img_id, img in enumerate(images):
        x = img[None].to(next(backbone.parameters()).dtype)
        with torch.no_grad(), capture_mixer_inputs(mixers) as seen:
            backbone.forward_layers(x, layers=[max(layer_ids)])  # runs every analysed layer
        for i in layer_ids:
            heads = pick(mixers[i].num_heads, args.max_heads, 'heads')
            meta = dict(model=name, layer=i)
            x_i, hw = seen.pop(i)  # the layer's own grid (MILA: one per stage)
            patches = backbone.token_layout(hw).patch_index
            with torch.no_grad():
                recs, spec = analyze_layer(mixers[i], x_i, hw, patches, heads, args.block_size,
                                           args.rel_tol, args.abs_tol, meta)
            for r in recs:
                r['image'] = img_id
            records += recs
            for key, s in spec.items():
                spectra.setdefault((name, i) + key, []).append(s.flatten(0, 1))
            pbar.update(1)
    return records, {k: torch.cat(v) for k, v in spectra.items()}


def main(argv=None):
    args = parse_args(argv)
    from tqdm import tqdm
    torch.manual_seed(args.seed)
    if args.checkpoint and len(args.checkpoint) != len(args.models):
        raise ValueError(f'--checkpoint: {len(args.checkpoint)} given for '
                         f'{len(args.models)} models (give one per model, in order)')
    images = load_images(args)
    os.makedirs(args.out_dir, exist_ok=True)
    records, spectra = [], {}
    for idx, spec in enumerate(args.models):
        backbone = build_backbone(spec, args.checkpoint[idx] if args.checkpoint else None, args)
        name = osp.splitext(osp.basename(spec))[0]
        total = len(images) * len(resolve_layers(args.layers, backbone.num_layers))
        with tqdm(total=total, desc=f'rank {name}', unit='layer') as pbar:
            recs, spec_m = analyze_model(name, backbone, images, args, pbar)
        records += recs
        spectra.update(spec_m)
        del backbone
    table = aggregate(records)
    write_csv(records, osp.join(args.out_dir, 'rank_blocks.csv'))
    write_csv(table, osp.join(args.out_dir, 'rank_summary.csv'))
    print(format_table(table, args))
    print('\n'.join(hierarchy_lines(table, args.block_size)))
    plot_rank_per_layer(table, osp.join(args.out_dir, 'rank_per_layer.png'))
    plot_spectra(spectra, osp.join(args.out_dir, 'offdiag_spectra.png'), args.block_size)
    print(f'wrote {args.out_dir}/rank_blocks.csv, rank_summary.csv, rank_per_layer.png, '
          'offdiag_spectra.png')
    return table


if __name__ == '__main__':
    main()
