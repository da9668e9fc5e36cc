"""Write feature-map figures of a backbone: map overlays, ROC curves and PCA (Figures 5-12).

    python tools/analysis/visualize_featmap.py CONFIG [CKPT] --dataset-slice 0:8 \
        [--layers -2 -1] [--map-type mixing|cosine] [--head-reduce mean] [--out-dir DIR]
    python tools/analysis/visualize_featmap.py CONFIG CKPT --img a.jpg b.jpg [--masks a.png b.png]

CONFIG is a Binary-AUC config (``configs/analysis/``: a ``FeatMapEvaluator`` model and a test
data set with foreground masks). Per image it writes ``<name>_maps.png`` (image + min-max
normalized map overlays, one row per layer, one column per head x query token, with AUCs when a
mask is known), ``<name>_roc.png`` (ROC per layer of the map averaged over heads and query
tokens) and ``<name>_pca.png`` (first three PCA components of the last layer's patch features as
RGB).
"""
import argparse
import os
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope
from tqdm import tqdm

import mmdinomamba  # noqa: F401  (registration)
from mmdinomamba.analysis import compute_featmaps, pca_rgb, plots
from mmdinomamba.evaluation import BinaryAUC, minmax_normalize, resize_mask, roc_curve
from mmdinomamba.models.utils import load_checkpoint_strict
from mmdinomamba.utils.cli import DictAction


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Feature-map figures (overlays, ROC, PCA)')
    p.add_argument('config')
    p.add_argument('checkpoint', nargs='?', default=None)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument('--img', nargs='+', help='image files')
    src.add_argument('--dataset-slice', help='start:stop of the config test data set')
    p.add_argument('--masks', nargs='+', help='binary fg masks (0/255 PNG) for --img')
    p.add_argument('--img-size', type=int, default=224, help='resize for --img')
    p.add_argument('--layers', type=int, nargs='+', help='layers (default: config)')
    p.add_argument('--map-type', choices=['mixing', 'cosine'])
    p.add_argument('--head-reduce', choices=['none', 'mean'])
    p.add_argument('--pca-threshold', type=float, default=None,
                   help='background threshold on the first PCA component (DINOv2 style)')
    p.add_argument('--out-dir', default='work_dirs/featmaps')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    return p.parse_args(argv)


def build_model(cfg, args):
    from mmpretrain.registry import MODELS
    model = MODELS.build(cfg.model)
    if args.checkpoint:
        load_checkpoint_strict(model, args.checkpoint)
    fcfg = model.featmap_cfg
    if args.layers:
        fcfg['layers'] = args.layers
    if args.map_type:
        fcfg['map_type'] = args.map_type
    if args.head_reduce:
        fcfg['head_reduce'] = None if args.head_reduce == 'none' else 'mean'
    return model.to(args.device).eval()


def build_items(cfg, args):
    """Yield (name, packed data) for each image."""
    from mmpretrain.registry import DATASETS, TRANSFORMS
    if args.dataset_slice:
        ds = DATASETS.build(cfg.test_dataloader.dataset)
        start, stop = (int(v) if v else None for v in args.dataset_slice.split(':'))
        for i in range(len(ds))[slice(start, stop)]:
            info = ds.get_data_info(i)
            yield f'{i:05d}_' + osp.splitext(osp.basename(info['img_path']))[0], ds[i]
        return
    masks = args.masks or [None] * len(args.img)
    if len(masks) != len(args.img):
        raise ValueError(f'--masks gives {len(masks)} files for {len(args.img)} images')
    for img, mask in zip(args.img, masks):
        steps = [dict(type='LoadImageFromFile')] + ([dict(type='LoadFgMask')] if mask else [])
        steps += [dict(type='Resize', scale=(args.img_size, args.img_size)),
                  dict(type='PackInputs', algorithm_keys=['gt_seg_map'])]
        results = dict(img_path=img, fg_mask_path=mask)
        for step in steps:
            results = TRANSFORMS.build(step)(results)
        yield osp.splitext(osp.basename(img))[0], results


def render(model, name, data, args):
    """Compute maps for one image and write its three figures."""
    data = model.data_preprocessor(pseudo_collate([data]), False)
    fm = compute_featmaps(model.backbone, data['inputs'], keep_tokens=True, **model.featmap_cfg)
    maps = fm.maps[0].cpu()  # (layers, heads, R, h, w)
    img = plots.preprocessor_image(data['inputs'][0].cpu(), model.data_preprocessor)
    seg = data['data_samples'][0].get('gt_seg_map')
    aucs, curves = None, []
    if seg is not None:
        fg, valid = resize_mask(torch.as_tensor(seg), tuple(maps.shape[-2:]))
        n = maps[..., 0, 0].numel()
        aucs = BinaryAUC.calculate(maps.reshape(n, -1), fg.flatten().expand(n, -1),
                                   valid=valid.flatten().expand(n, -1))['auc']
        aucs = aucs.reshape(maps.shape[:3])
        for i, layer in enumerate(fm.layers):
            mean_map = minmax_normalize(maps[i].mean((0, 1)))
            fpr, tpr = roc_curve(mean_map.flatten(), fg.flatten(), valid.flatten())
            auc = BinaryAUC.calculate(mean_map[None], fg[None], valid=valid[None])['auc']
            curves.append((f'layer {layer}', fpr, tpr, float(auc)))
    base = osp.join(args.out_dir, name)
    title = f'{fm.map_type} maps of {name} (min-max normalized per map)'
    plots.plot_featmap_grid(img, maps, fm.layers, fm.query_index, f'{base}_maps.png', title,
                            aucs)
    if curves:
        plots.plot_roc(curves, f'{base}_roc.png', title=f'ROC, mean over heads ({name})')
    rgb = pca_rgb(fm.patch_tokens[-1].cpu(), tuple(maps.shape[-2:]), args.pca_threshold)[0]
    plots.plot_pca(img, rgb, f'{base}_pca.png', title=f'PCA, layer {fm.layers[-1]}')
    return None if aucs is None else float(aucs.nanmean())


def main(argv=None):
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    os.makedirs(args.out_dir, exist_ok=True)
    model = build_model(cfg, args)
    items = list(build_items(cfg, args))
    aucs = []
    with torch.no_grad():
        for name, data in tqdm(items, desc='feature maps', unit='img'):
            aucs.append(render(model, name, data, args))
    known = [a for a in aucs if a is not None]
    msg = f'wrote {3 * len(items)} figures for {len(items)} images to {args.out_dir}'
    if known:
        msg += f'; mean raw AUC over maps {100 * sum(known) / len(known):.1f}%'
    print(msg)
    return aucs


if __name__ == '__main__':
    main()
