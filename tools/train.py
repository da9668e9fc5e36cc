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
import shlex
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.logging import print_log  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmdinomamba.models.utils.checkpoint_file import (  # noqa: E402
    CheckpointFileError, checkpoint_file_problem, last_good_checkpoint)
from mmdinomamba.utils.cfg_check import check_runner_args  # noqa: E402
from mmdinomamba.utils.cli import (DictAction, add_tensorboard, check_data_roots,  # noqa: E402
                                   finish_distributed, keep_freed_memory_on_cpu, load_config,
                                   setup_cpu_distributed)
from mmdinomamba.utils.files import WorkDirWriteError  # noqa: E402
from mmdinomamba.utils.workdir_lock import WorkDirInUseError, work_dir_lock  # noqa: E402


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


def _resume_command(argv, resume: str, path: str) -> str:
    """The command line ``argv`` of this run with ``--resume PATH`` instead of its own."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith('--resume='):
            i += 1
            continue
        if arg == '--resume':
            i += 1 if resume == 'auto' else 2
            continue
        out.append(arg)
        i += 1
    script = osp.relpath(osp.abspath(__file__))
    script = osp.abspath(__file__) if script.startswith('..') else script
    return shlex.join(['python', script, *out, '--resume', path])


def damaged_resume_message(path: str, problem: str, work_dir: str, argv, resume: str,
                           built: bool = False) -> str:
    """The error of ``--resume`` from a damaged checkpoint: what is wrong, the last good
    checkpoint of the work dir and the command to resume from it (nothing is changed; with
    ``built``, the runner has made its new log folder)."""
    lines = [f'--resume: cannot resume from {path}: {problem}']
    good = last_good_checkpoint(osp.dirname(osp.abspath(path)), exclude=path)
    if good is None and osp.abspath(osp.dirname(path)) != osp.abspath(work_dir):
        good = last_good_checkpoint(work_dir, exclude=path)
    if good:
        lines += [f'The last good checkpoint is {good}; resume from it with:',
                  f'  {_resume_command(argv, resume, good)}']
    else:
        lines.append(f'There is no other complete checkpoint next to it (with max_keep_ckpts=1 '
                     'only the newest is kept): train again without --resume, in another '
                     '--work-dir to keep this folder as it is.')
    lines.append('Nothing else was changed on disk (the runner made only its new log folder).'
                 if built else 'Nothing was changed on disk.')
    return '\n'.join(lines)


def check_resume_checkpoint(cfg, args, argv) -> None:
    """Stop before anything is built or written when the checkpoint to resume from is
    damaged (truncated, empty, not a checkpoint), naming the last good one."""
    path = cfg.get('load_from') if cfg.get('resume') else None
    problem = checkpoint_file_problem(path) if path else None
    if problem:
        raise SystemExit(damaged_resume_message(path, problem, cfg.work_dir, argv, args.resume))


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


def _rank_zero() -> bool:
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


def train(cfg, args, argv) -> None:
    """Build the runner and train, with one-line errors for damaged checkpoint files."""
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    try:
        runner.train()
    except CheckpointFileError as err:
        resumed = cfg.get('resume') and cfg.get('load_from') and osp.abspath(
            err.path) == osp.abspath(cfg.load_from)
        raise SystemExit(damaged_resume_message(err.path, err.problem, cfg.work_dir, argv,
                                                args.resume, built=True)
                         if resumed else f'error: {err}') from None
    del runner  # before the process group goes (see finish_distributed)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    keep_freed_memory_on_cpu()
    cfg = load_config(args.config, args.cfg_options, args.allow_new_keys)
    cfg = merge_args(cfg, args)
    check_runner_args(cfg)  # hook / loop / init_cfg typos, before anything is built
    check_resume_checkpoint(cfg, args, argv)
    check_data_roots(cfg)
    setup_cpu_distributed(cfg)
    try:
        with work_dir_lock(cfg.work_dir, enabled=_rank_zero()):
            train(cfg, args, argv)
    except (WorkDirInUseError, WorkDirWriteError) as err:
        raise SystemExit(f'error: {err}') from None
    finish_distributed()


if __name__ == '__main__':
    main()
