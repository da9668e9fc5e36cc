"""Quick DINO recipe experiments on a small data folder: the project's DINO model, loss and
multi-crop, trained by a plain PyTorch loop on images held in memory, evaluated every few
iterations by k-NN on the teacher's cls feature (and, at the end, by the linear probe and
Binary-AUC), next to the same backbone at random init.

It is the tool behind docs/dino_small_scale.md: one command per experiment, one JSON line per
result (``--out``). The demo (``tools/demo.py``) runs the chosen recipe through the OpenMMLab
machinery; this loop is for searching it (same settings, fewer moving parts).

    python tools/analysis/dino_search.py --data-root data/embedded --iters 300 \\
        --centering ema --out work_dirs/dino_search.jsonl

The defaults are the demo config's recipe (Sinkhorn-Knopp centering, teacher momentum 0.99 ->
0.999, the demo's crops and augmentation); each flag changes one setting.
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdinomamba.datasets.normalization import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    a = p.add_argument
    a('--data-root', default='data/embedded', help='a folder in the demo layout')
    a('--img-size', type=int, default=64)
    a('--iters', type=int, default=300)
    a('--batch', type=int, default=32)
    a('--arch', default='dinovim', choices=['dinovim', 'vit', 'linearvit'])
    a('--width', type=int, default=64)
    a('--depth', type=int, default=4)
    a('--patch', type=int, default=8)
    a('--local-size', type=int, default=32)
    a('--num-local', type=int, default=4)
    a('--global-scale', type=float, nargs=2, default=(0.4, 1.))
    a('--local-scale', type=float, nargs=2, default=(0.05, 0.4))
    a('--jitter', type=float, nargs=4, default=(0.2, 0.2, 0., 0.),
      metavar=('BRIGHTNESS', 'CONTRAST', 'SATURATION', 'HUE'))
    a('--grayscale', type=float, default=0.)
    a('--solarize', type=float, default=0.)
    a('--blur-probs', type=float, nargs=3, default=(0.5, 0.1, 0.2))
    a('--blur-radius', type=float, nargs=2, default=(0.1, 0.6))
    a('--out-dim', type=int, default=256)
    a('--hidden', type=int, default=512)
    a('--bottleneck', type=int, default=128)
    a('--head-bn', action='store_true')
    a('--teacher-temp', type=float, default=0.04)
    a('--student-temp', type=float, default=0.1)
    a('--centering', default='sinkhorn_knopp', choices=['ema', 'sinkhorn_knopp'])
    a('--koleo', type=float, default=0.)
    a('--momentum', type=float, nargs=2, default=(0.99, 0.999))
    a('--lr', type=float, default=1e-3)
    a('--min-lr', type=float, default=1e-5)
    a('--warmup', type=int, default=20)
    a('--weight-decay', type=float, nargs=2, default=(0.04, 0.4))
    a('--clip', type=float, default=3.)
    a('--eval-every', type=int, default=100)
    a('--seeds', type=int, default=3, help='random-init seeds of the baseline')
    a('--seed', type=int, default=0)
    a('--out', help='append the result as one JSON line to this file')
    return p.parse_args(argv)


def load_split(root: str, split: str, size: int):
    """Images (N, size, size, 3) uint8 RGB, labels (N,), masks (N, size, size) bool or None."""
    from mmdinomamba.datasets.folder import mask_path
    images, labels, masks = [], [], []
    with open(osp.join(root, 'meta', f'{split}.txt')) as f:
        rows = [line.rsplit(maxsplit=1) for line in f if line.strip()]
    for rel, label in rows:
        img = Image.open(osp.join(root, split, rel)).convert('RGB').resize((size, size),
                                                                           Image.BILINEAR)
        images.append(np.asarray(img))
        labels.append(int(label))
        mp = mask_path(root, split, rel)
        masks.append(None if mp is None else
                     np.asarray(Image.open(mp).convert('L').resize((size, size),
                                                                   Image.NEAREST)) > 0)
    has_masks = all(m is not None for m in masks)
    return np.stack(images), np.array(labels), np.stack(masks) if has_masks else None


def normalize(x: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, 3, H, W) normalized float."""
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).float()
    return (t - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        IMAGENET_STD).view(1, 3, 1, 1)


def backbone_cfg(args) -> dict:
    if args.arch == 'dinovim':
        return dict(type='DinoVim', arch=dict(embed_dims=args.width, num_layers=args.depth),
                    mixer_cfg=dict(d_state=16, headdim=16), img_size=args.img_size,
                    patch_size=args.patch)
    return dict(type='ViT' if args.arch == 'vit' else 'LinearViT',
                arch=dict(embed_dims=args.width, num_layers=args.depth,
                          num_heads=args.width // 16, mlp_ratio=4),
                img_size=args.img_size, patch_size=args.patch)


class MultiCropData(torch.utils.data.Dataset):
    """The project's ``DINOMultiCrop`` on in-memory RGB images."""

    def __init__(self, images, args):
        from mmpretrain.registry import TRANSFORMS
        self.images = images
        b, c, s, h = args.jitter
        self.transform = TRANSFORMS.build(dict(
            type='DINOMultiCrop', global_crop_size=args.img_size,
            local_crop_size=args.local_size, global_crops_scale=tuple(args.global_scale),
            local_crops_scale=tuple(args.local_scale), num_local_crops=args.num_local,
            color_jitter=dict(brightness=b, contrast=c, saturation=s, hue=h),
            grayscale_prob=args.grayscale, global_solarize_probs=(0., args.solarize),
            blur_radius=tuple(args.blur_radius), global_blur_probs=tuple(args.blur_probs[:2]),
            local_blur_prob=args.blur_probs[2]))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        views = self.transform(dict(img=self.images[i][..., ::-1].copy()))['img']  # BGR
        return [torch.from_numpy(v[..., ::-1].copy()).permute(2, 0, 1) for v in views]


@torch.no_grad()
def features(backbone, images, batch=240):
    backbone.eval()
    return torch.cat([backbone(normalize(images[i:i + batch]))[-1]
                      for i in range(0, len(images), batch)])


@torch.no_grad()
def binary_auc(backbone, images, masks, batch=120):
    """Raw Binary-AUC (%) per layer: CLS row of the mixing matrix, mean over heads."""
    from mmdinomamba.analysis.featmaps import compute_featmaps
    from mmdinomamba.evaluation import BinaryAUC, resize_mask
    backbone.eval()
    per_image = []
    for i in range(0, len(images), batch):
        fm = compute_featmaps(backbone, normalize(images[i:i + batch]), layers=None,
                              map_type='mixing', head_reduce='mean')
        b, nl = fm.maps.shape[:2]
        fg, valid = resize_mask(torch.from_numpy(masks[i:i + batch]).long(),
                                tuple(fm.maps.shape[-2:]))
        auc = BinaryAUC.calculate(fm.maps.reshape(b * nl, *fm.maps.shape[-2:]),
                                  fg.repeat_interleave(nl, 0), valid=valid.repeat_interleave(
                                      nl, 0))['auc'].reshape(b, nl)
        per_image.append(auc)
    auc = torch.cat(per_image)
    auc = auc[~torch.isnan(auc).any(1)]
    return (auc.mean(0) * 100).tolist()


def evaluate(backbone, data, full: bool) -> dict:
    from mmdinomamba.evaluation import fit_logistic_probe, knn_predict
    (xtr, ytr, _), (xva, yva, mva) = data
    ftr, fva = features(backbone, xtr), features(backbone, xva)
    ytr, yva = torch.from_numpy(ytr), torch.from_numpy(yva)
    nc = int(max(ytr.max(), yva.max())) + 1
    out = dict(knn=100. * float((knn_predict(ftr, ytr, fva, nc) == yva).float().mean()))
    if full:
        probe = fit_logistic_probe(ftr, ytr, nc)
        out['linear'] = 100. * float((probe.predict(fva) == yva).float().mean())
        if mva is not None:
            layers = binary_auc(backbone, xva, mva)
            out.update(auc_layers=layers, auc_mean=float(np.mean(layers)))
    return out


def build_dino(args):
    from mmpretrain.registry import MODELS
    model = MODELS.build(dict(
        type='DINO', backbone=backbone_cfg(args),
        head=dict(type='DINOHead', in_channels=args.width, out_channels=args.out_dim,
                  hidden_channels=args.hidden, bottleneck_channels=args.bottleneck,
                  use_bn=args.head_bn),
        loss=dict(type='DINOLoss', student_temp=args.student_temp, centering=args.centering),
        teacher_temp=args.teacher_temp, warmup_teacher_temp=args.teacher_temp,
        warmup_teacher_temp_epochs=0, momentum_teacher=args.momentum[0],
        final_momentum_teacher=args.momentum[1], freeze_last_layer=0,
        koleo_weight=args.koleo))
    model.init_weights()
    return model


def optimizer(model, args):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith('teacher'):
            (no_decay if p.ndim <= 1 or name.endswith('.bias') else decay).append(p)
    return torch.optim.AdamW([dict(params=decay), dict(params=no_decay, weight_decay=0.)],
                             lr=args.lr, weight_decay=args.weight_decay[0])


def schedule(args, it: int) -> tuple:
    """(lr, weight decay) of iteration ``it``: linear warm-up then cosine, as the config."""
    lr = args.lr * min(1., (it + 1) / max(1, args.warmup))
    if it >= args.warmup:
        q = (it - args.warmup) / max(1, args.iters - args.warmup)
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * q))
    w0, w1 = args.weight_decay
    wd = w1 + (w0 - w1) * 0.5 * (1 + math.cos(math.pi * it / args.iters))
    return lr, wd


def train(model, data, args, log):
    opt = optimizer(model, args)
    loader = torch.utils.data.DataLoader(MultiCropData(data[0][0], args), batch_size=args.batch,
                                         shuffle=True, drop_last=True, num_workers=0)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    it, start, curve = 0, time.time(), []
    while it < args.iters:
        for views in loader:
            if it >= args.iters:
                break
            lr, wd = schedule(args, it)
            for group in opt.param_groups:
                group['lr'] = lr
            opt.param_groups[0]['weight_decay'] = wd
            model.train()
            model.set_progress(it, args.iters, len(loader))
            out = model.loss([(v.float() - mean) / std for v in views])
            opt.zero_grad()
            out['loss'].backward()
            torch.nn.utils.clip_grad_norm_(
                [p for g in opt.param_groups for p in g['params']], args.clip)
            opt.step()
            model.update_teacher()
            it += 1
            if it % 25 == 0:
                log(f'it {it} ' + ' '.join(f'{k} {float(out[k]):.3f}' for k in (
                    'loss', 'teacher_entropy', 'teacher_batch_entropy', 'prototypes_used')) +
                    f' {time.time() - start:.0f}s')
            if it % args.eval_every == 0 or it == args.iters:
                ev = evaluate(model.teacher['backbone'], data, full=it == args.iters)
                ev.update(it=it, signals={k: float(out[k]) for k in (
                    'teacher_entropy', 'teacher_batch_entropy', 'prototypes_used')})
                curve.append(ev)
                log(f'eval {json.dumps(ev)}')
    return curve, time.time() - start


def main(argv=None):
    args = parse_args(argv)
    from mmengine.registry import init_default_scope

    import mmdinomamba  # noqa: F401 (registration)
    init_default_scope('mmpretrain')
    torch.manual_seed(args.seed)
    data = (load_split(args.data_root, 'train', args.img_size),
            load_split(args.data_root, 'val', args.img_size))

    def log(msg):
        print(msg, flush=True)

    from mmpretrain.registry import MODELS
    randoms = []
    for seed in range(args.seeds):
        torch.manual_seed(1000 + seed)
        backbone = MODELS.build(backbone_cfg(args))
        backbone.init_weights()
        randoms.append(evaluate(backbone, data, full=True))
        log(f'random seed {seed}: {json.dumps(randoms[-1])}')
    torch.manual_seed(args.seed)
    model = build_dino(args)
    curve, seconds = train(model, data, args, log)
    result = dict(args=vars(args), random=randoms, curve=curve, train_seconds=seconds)
    best = {k: max(r[k] for r in randoms) for k in ('knn', 'linear') if randoms}
    final = curve[-1]
    log(f'RESULT knn {final["knn"]:.1f} (best random {best.get("knn", float("nan")):.1f}) '
        f'linear {final.get("linear", float("nan")):.1f} (best random '
        f'{best.get("linear", float("nan")):.1f}) auc {final.get("auc_mean", float("nan")):.1f} '
        f'(random {[round(r.get("auc_mean", float("nan")), 1) for r in randoms]})')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'a') as f:
            f.write(json.dumps(result) + '\n')


if __name__ == '__main__':
    main()
