"""Evaluate one linear-probe checkpoint on the ImageNet distribution shifts (paper Table 4).

Runs the probe (CONFIG + CHECKPOINT, a checkpoint written by ``tools/train.py`` for that config)
on ImageNet-V2 (matched-frequency, threshold-0.7, top-images), ImageNet-Sketch, ImageNet-A,
ImageNet-R (both restricted to their 200 classes) and ImageNet-ReaL, skipping (with a message)
every set whose folder is missing. Prints the Table 4 row as markdown and writes a json.
Data sets and their expected layouts: ``configs/_base_/datasets/imagenet-*_probe_test.py``.

Example::

    python tools/analysis/eval_robustness.py \
        configs/linear_probe/linear-probe_dinovim-b-p16-2blk_4xb128-coslr-100e_in1k.py \
        work_dirs/linear-probe_dinovim-b-p16-2blk_4xb128-coslr-100e_in1k/epoch_100.pth \
        --data-root-a /datasets/imagenet-a --data-root-real /datasets/imagenet --name DinoVim-B
"""
import argparse
import json
import os
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.evaluator import Evaluator  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import Runner, load_checkpoint  # noqa: E402

from mmdinomamba.utils.cli import DictAction, load_config  # noqa: E402

BASES = osp.join(REPO, 'configs', '_base_', 'datasets')
#: (key, Table 4 column, dataset base config)
SETS = (
    ('v2-mf', 'V2 MF', 'imagenet-v2-mf_probe_test.py'),
    ('v2-t07', 'V2 T0.7', 'imagenet-v2-t07_probe_test.py'),
    ('v2-ti', 'V2 TI', 'imagenet-v2-ti_probe_test.py'),
    ('sketch', 'Sketch', 'imagenet-sketch_probe_test.py'),
    ('a', 'A', 'imagenet-a_probe_test.py'),
    ('r', 'R', 'imagenet-r_probe_test.py'),
    ('real', 'ReaL', 'imagenet-real_probe_test.py'),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Table 4: robustness of a linear probe')
    parser.add_argument('config', help='linear-probe config')
    parser.add_argument('checkpoint', help='probe checkpoint (whole model) of that config')
    for key, title, base in SETS:
        parser.add_argument(f'--data-root-{key}', dest=f'root_{key.replace("-", "_")}',
                            help=f'{title} folder (default: data_root of {base})')
    parser.add_argument('--real-file', help='real.json (default: <ReaL data root>/real.json)')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--num-workers', type=int, default=4)
    parser.add_argument('--max-images', type=int, help='evaluate only the first N of each set')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--name', help='row label (default: the config name)')
    parser.add_argument('--out', help='json file (default: work_dirs/robustness/<config>.json)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override keys of CONFIG')
    return parser.parse_args(argv)


def build_probe(args):
    """The model of CONFIG with the weights of CHECKPOINT (strict), in eval mode."""
    cfg = load_config(args.config, args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    for module in cfg.get('custom_imports', {}).get('imports', []):
        __import__(module)
    from mmpretrain.registry import MODELS
    model_cfg = cfg.model
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    model = MODELS.build(model_cfg)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    load_checkpoint(model, args.checkpoint, map_location='cpu', strict=True)
    return model.to(args.device).eval()


def set_loader_cfg(args, key: str, base: str):
    """(test_dataloader cfg, test_evaluator cfg) of one set, or a reason to skip it."""
    cfg = Config.fromfile(osp.join(BASES, base))
    loader = cfg.test_dataloader
    root = getattr(args, f'root_{key.replace("-", "_")}') or loader.dataset.data_root
    if not osp.isdir(root):
        return None, f'folder {root} not found (pass --data-root-{key})'
    loader.dataset.data_root = root
    if key == 'real':
        real = args.real_file or osp.join(root, 'real.json')
        if not osp.isfile(real):
            return None, f'{real} not found (pass --real-file)'
        loader.dataset.real_file = osp.abspath(real)
    if args.max_images:
        loader.dataset.indices = args.max_images
    loader.update(batch_size=args.batch_size, num_workers=args.num_workers,
                  persistent_workers=args.num_workers > 0)
    return (loader, cfg.test_evaluator), None


@torch.no_grad()
def evaluate(model, loader_cfg, evaluator_cfg) -> dict:
    """Run ``model.test_step`` over the loader and return the evaluator's metrics."""
    loader = Runner.build_dataloader(loader_cfg)
    evaluator = Evaluator(evaluator_cfg)
    evaluator.dataset_meta = getattr(loader.dataset, 'metainfo', None)
    for batch in loader:
        evaluator.process(data_samples=model.test_step(batch), data_batch=batch)
    metrics = evaluator.evaluate(len(loader.dataset))
    metrics['num_samples'] = len(loader.dataset)
    return metrics


def top1(metrics: dict) -> float:
    return next(v for k, v in metrics.items() if k.endswith('/top1'))


def table(name: str, results: dict) -> str:
    """Markdown header + the Table 4 row (``-`` for skipped sets)."""
    head = '| Model | ' + ' | '.join(t for _, t, _ in SETS) + ' |'
    rule = '|' + '---|' * (len(SETS) + 1)
    cells = [f'{top1(results[k]):.1f}' if k in results else '-' for k, _, _ in SETS]
    return '\n'.join([head, rule, f'| {name} | ' + ' | '.join(cells) + ' |'])


def main(argv=None) -> dict:
    args = parse_args(argv)
    model = build_probe(args)
    results, skipped = {}, {}
    for key, title, base in SETS:
        cfgs, reason = set_loader_cfg(args, key, base)
        if cfgs is None:
            skipped[key] = reason
            print(f'[eval_robustness] skip {title}: {reason}')
            continue
        results[key] = evaluate(model, *cfgs)
        print(f'[eval_robustness] {title}: top-1 {top1(results[key]):.2f} '
              f'({results[key]["num_samples"]} images)')
    stem = osp.splitext(osp.basename(args.config))[0]
    name = args.name or stem
    print(table(name, results))
    out = args.out or osp.join('work_dirs', 'robustness', f'{stem}.json')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    report = dict(name=name, config=args.config, checkpoint=args.checkpoint,
                  columns={k: t for k, t, _ in SETS}, results=results, skipped=skipped)
    with open(out, 'w') as f:
        json.dump(report, f, indent=1)
    print(f'[eval_robustness] wrote {out}')
    return report


if __name__ == '__main__':
    main()
