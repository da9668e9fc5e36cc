"""Train with any mmdinomamba config (pretrain, linear probe, seg or det).

The config's ``default_scope`` picks the library (mmpretrain / mmseg / mmdet).

Example:
    python tools/train.py configs/pretrain/dino_dinovim-demo_1xb64-20e_embedded.py
    python tools/train.py CONFIG --work-dir work_dirs/x --resume --amp
    python tools/train.py CONFIG --tensorboard   # also log to TensorBoard (work_dir/*/vis_data)
"""
import argparse
import glob
import logging
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.logging import print_log  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmdinomamba.utils.cli import (DictAction, add_tensorboard, check_data_roots,  # noqa: E402
                                   finish_distributed, keep_freed_memory_on_cpu, load_config,
                                   setup_cpu_distributed)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from the given checkpoint, or from the latest checkpoint '
                        'in the work_dir when no path is given')
    parser.add_argument('--amp', action='store_true', help='enable automatic mixed precision')
    parser.add_argument('--no-validate', action='store_true', help='skip validation during training')
    parser.add_argument('--auto-scale-lr', action='store_true', help='scale lr by batch size')
    parser.add_argument('--tensorboard', action='store_true',
                        help='also log to TensorBoard (losses, DINO collapse signals, metrics, '
                        'Binary-AUC per layer and its map figures); needs `pip install '
                        'tensorboard`')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. train_cfg.max_epochs=2')
    parser.add_argument('--allow-new-keys', action='store_true',
                        help='let --cfg-options add keys that the config does not define')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def latest_checkpoint(work_dir: str):
    """The checkpoint that ``--resume`` without a path continues from: the one named in
    ``work_dir/last_checkpoint``. None, with a warning naming the folder, when there is none
    (training then starts from scratch); an error when that file names a missing checkpoint."""
    marker = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(marker):
        found = sorted(glob.glob(osp.join(work_dir, '*.pth')))
        hint = (f' It holds {len(found)} .pth file(s) (e.g. {osp.basename(found[-1])}); pass '
                'one with --resume PATH to resume from it.' if found else '')
        print_log(f'--resume: no checkpoint to resume from in {osp.abspath(work_dir)} (no '
                  f'last_checkpoint file): training starts from scratch.{hint}',
                  logger='current', level=logging.WARNING)
        return None
    with open(marker) as f:
        path = f.read().strip()
    if not osp.isfile(path):
        raise FileNotFoundError(f'--resume: {marker} names {path!r}, which does not exist; '
                                'pass the checkpoint to resume from with --resume PATH')
    return path


def merge_args(cfg, args):
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        opt = cfg.optim_wrapper
        amp_type = dict(OptimWrapper='AmpOptimWrapper', AmpOptimWrapper='AmpOptimWrapper',
                        DINOOptimWrapper='DINOAmpOptimWrapper',
                        DINOAmpOptimWrapper='DINOAmpOptimWrapper')
        if opt.get('type', 'OptimWrapper') not in amp_type:
            raise ValueError(f'--amp: unsupported optim_wrapper type {opt.type!r}')
        opt.type = amp_type[opt.get('type', 'OptimWrapper')]
        opt.setdefault('loss_scale', 'dynamic')
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, latest_checkpoint(cfg.work_dir)
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'--resume: checkpoint not found: {args.resume}')
        cfg.resume, cfg.load_from = True, args.resume
    if args.no_validate:
        for key in ('val_cfg', 'val_dataloader', 'val_evaluator'):
            cfg[key] = None
    if args.auto_scale_lr:
        cfg.setdefault('auto_scale_lr', {})['enable'] = True
    if args.tensorboard:
        add_tensorboard(cfg)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    keep_freed_memory_on_cpu()
    cfg = load_config(args.config, args.cfg_options, args.allow_new_keys)
    cfg = merge_args(cfg, args)
    check_data_roots(cfg)
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()
    del runner  # before the process group goes (see finish_distributed)
    finish_distributed()


if __name__ == '__main__':
    main()
