r"""Print the merged config values that matter for the paper comparison (optimizer, schedule,
batch, crop / resize, backbone outputs), and with ``--check`` compare them with the paper's
Appendix C (segmentation for ``default_scope='mmseg'`` configs, detection for ``'mmdet'``).

Example:
    python tools/analysis/print_config_settings.py configs/seg/*_ade20k-512x512.py \
        configs/det/*_coco.py --check
"""
import argparse
import os.path as osp
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmengine.config import Config  # noqa: E402

GEOMETRIC = ('Resize', 'RandomResize', 'RandomChoiceResize', 'RandomCrop', 'Pad', 'RandomFlip')
BACKBONE_KEYS = ('type', 'arch', 'img_size', 'patch_size', 'out_indices', 'out_type',
                 'drop_path_rate', 'init_cfg')
NECK_KEYS = ('type', 'in_channels', 'out_channels', 'scales', 'scale_factors', 'num_outs',
             'norm_cfg')


def _plain(value: Any) -> Any:
    """ConfigDict / tuple-heavy values -> plain dicts and lists for printing."""
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _call(cfg: dict, keys=None, skip=('type', )) -> str:
    """``Type(k=v, ...)`` for a registry dict."""
    items = [(k, v) for k, v in cfg.items() if (keys is None or k in keys) and k not in skip]
    return f"{cfg.get('type')}(" + ', '.join(f'{k}={_plain(v)!r}' for k, v in items) + ')'


def _dataset(loader) -> dict:
    dataset = (loader or {}).get('dataset', {})
    while 'dataset' in dataset:  # wrappers (RepeatDataset, ...)
        dataset = dataset['dataset']
    return dataset


def _pipeline(loader) -> List[str]:
    return [_call(t) for t in _dataset(loader).get('pipeline', []) if t.get('type') in GEOMETRIC]


def collect_settings(cfg: Config) -> Dict[str, Any]:
    """The values to compare, as an ordered ``{name: value}`` dict."""
    model, optim = cfg.model, cfg.get('optim_wrapper', {})
    out = {'default_scope': cfg.get('default_scope')}
    out['backbone'] = {k: _plain(model.backbone[k]) for k in BACKBONE_KEYS if k in model.backbone}
    out['neck'] = {k: _plain(model.neck[k]) for k in NECK_KEYS if k in model.get('neck', {})}
    for head in ('decode_head', 'auxiliary_head', 'rpn_head', 'roi_head'):
        if model.get(head):
            out[head] = model[head].get('type')
    out['data_preprocessor'] = {k: _plain(v) for k, v in model.get('data_preprocessor', {}).items()
                                if k in ('size', 'size_divisor', 'pad_size_divisor')}
    out['optim_wrapper'] = _call(optim, skip=('type', 'optimizer', 'paramwise_cfg'))
    for key in ('type', 'lr', 'betas', 'weight_decay', 'eps'):
        if key in optim.get('optimizer', {}):
            out[f'optimizer.{key}'] = _plain(optim.optimizer[key])
    out['paramwise_cfg'] = _plain(optim.get('paramwise_cfg'))
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    out['param_scheduler'] = [_call(s) for s in schedulers]
    out['train_cfg'] = _call(cfg.get('train_cfg', {}))
    out['test_cfg.mode'] = model.get('test_cfg', {}).get('mode')
    loader = cfg.get('train_dataloader') or {}
    match = re.search(r'_(\d+)xb(\d+)', osp.basename(cfg.filename or ''))
    gpus = int(match.group(1)) if match else 1
    out['batch'] = f"{loader.get('batch_size')} per GPU x {gpus} GPUs (from the file name) = " \
        f"{(loader.get('batch_size') or 0) * gpus}"
    out['train_dataset'] = _dataset(loader).get('type')
    out['train_pipeline'] = _pipeline(loader)
    out['test_pipeline'] = _pipeline(cfg.get('test_dataloader'))
    return out


def _scheduler(cfg: Config, name: str) -> Optional[dict]:
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    found = [s for s in schedulers if s.get('type') == name]
    return _plain(found[0]) if found else None


def _transform(cfg: Config, loader: str, name: str, key: str):
    for t in _dataset(cfg.get(loader)).get('pipeline', []):
        if t.get('type') == name:
            return _plain(t.get(key))
    return None


def _paramwise(cfg: Config, key: str):
    pw = _plain(cfg.optim_wrapper.get('paramwise_cfg') or {})
    if key in pw:
        return pw[key]
    return pw.get('custom_keys', {}).get(key, {}).get('decay_mult')


Check = Tuple[str, Callable[[Config], Any], Any]
_OPT = lambda k: lambda c: _plain(c.optim_wrapper.optimizer.get(k))  # noqa: E731
_SCHED = lambda n, *ks: lambda c: tuple((_scheduler(c, n) or {}).get(k) for k in ks)  # noqa
PAPER: Dict[str, List[Check]] = {
    'mmseg': [
        ('optimizer', _OPT('type'), 'AdamW'), ('lr', _OPT('lr'), 6e-5),
        ('betas', lambda c: tuple(_OPT('betas')(c)), (0.9, 0.999)),
        ('weight_decay', _OPT('weight_decay'), 0.05),
        ('LinearLR (start_factor, begin, end, by_epoch)',
         _SCHED('LinearLR', 'start_factor', 'begin', 'end', 'by_epoch'), (1e-6, 0, 1500, False)),
        ('PolyLR (begin, end, by_epoch)', _SCHED('PolyLR', 'begin', 'end', 'by_epoch'),
         (1500, 160000, False)),
        ('max_iters', lambda c: c.train_cfg.get('max_iters'), 160000),
        ('crop size', lambda c: tuple(_transform(c, 'train_dataloader', 'RandomCrop',
                                                 'crop_size') or ()), (512, 512)),
    ],
    'mmdet': [
        ('optimizer', _OPT('type'), 'AdamW'), ('lr', _OPT('lr'), 1e-4),
        ('weight_decay', _OPT('weight_decay'), 0.1),
        ('bias decay_mult', lambda c: _paramwise(c, 'bias_decay_mult'), 0.),
        ('pos_embed decay_mult', lambda c: _paramwise(c, 'pos_embed'), 0.),
        ('LinearLR (begin, end, by_epoch)', _SCHED('LinearLR', 'begin', 'end', 'by_epoch'),
         (0, 500, False)),
        ('MultiStepLR (milestones, by_epoch)', lambda c: (
            list((_scheduler(c, 'MultiStepLR') or {}).get('milestones') or []),
            (_scheduler(c, 'MultiStepLR') or {}).get('by_epoch')), ([8, 11], True)),
        ('max_epochs', lambda c: c.train_cfg.get('max_epochs'), 12),
        ('train resize', lambda c: tuple(_transform(c, 'train_dataloader', 'Resize', 'scale')
                                         or ()), (1333, 800)),
        ('test resize', lambda c: tuple(_transform(c, 'test_dataloader', 'Resize', 'scale')
                                        or ()), (1333, 800)),
    ],
}


def check_against_paper(cfg: Config) -> List[Tuple[str, Any, Any, bool]]:
    """``(name, config value, paper value, equal)`` for every paper setting of this task."""
    rows = []
    for name, get, expected in PAPER.get(cfg.get('default_scope'), []):
        try:
            value = get(cfg)
        except (AttributeError, KeyError, TypeError):
            value = None
        rows.append((name, value, expected, value == expected))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('configs', nargs='+', help='config files (seg: default_scope mmseg, '
                        'det: default_scope mmdet; other scopes are printed without a check)')
    parser.add_argument('--check', action='store_true',
                        help="compare with the paper's Appendix C; exit 1 on a mismatch")
    args = parser.parse_args(argv)
    failed = 0
    missing = [p for p in args.configs if not osp.isfile(p)]
    if missing:
        parser.error(f'config file(s) not found: {", ".join(missing)}')
    import mmdinomamba  # noqa: F401  (lets mmengine resolve the mmseg:: / mmdet:: bases)
    for path in args.configs:
        cfg = Config.fromfile(path)
        print(f'=== {path}')
        for key, value in collect_settings(cfg).items():
            if isinstance(value, list):
                print(f'  {key}:')
                for item in value:
                    print(f'    - {item}')
            else:
                print(f'  {key}: {value}')
        if args.check:
            rows = check_against_paper(cfg)
            if not rows:
                print('  (no paper settings for this default_scope)')
            for name, value, expected, ok in rows:
                failed += not ok
                print(f"  [{'ok' if ok else 'DIFF'}] {name}: config {value!r}, paper {expected!r}")
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
