"""Evaluate a checkpoint with any mmdinomamba config (metrics come from the config's evaluator).

Example:
    python tools/test.py configs/analysis/binary-auc_dinovim-demo_embedded.py --checkpoint CKPT
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.runner import Runner  # noqa: E402

from mmdinomamba.models.utils.checkpoint_file import (CheckpointFileError,  # noqa: E402
                                                      check_checkpoint_file)
from mmdinomamba.utils.cfg_check import check_runner_args  # noqa: E402
from mmdinomamba.utils.cli import (DictAction, add_tensorboard, check_data_roots,  # noqa: E402
                                   check_out_path, dump_metrics, finish_distributed,
                                   keep_freed_memory_on_cpu, load_config,
                                   setup_cpu_distributed)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint file (positional form)')
    parser.add_argument('--checkpoint', dest='checkpoint_opt', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and metrics')
    parser.add_argument('--out', help='dump the metrics to this .json/.pkl file (NaN -> null)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. test_dataloader.batch_size=8')
    parser.add_argument('--allow-new-keys', action='store_true',
                        help='let --cfg-options add keys that the config does not define')
    parser.add_argument('--tensorboard', action='store_true',
                        help='also log the metrics to TensorBoard; needs `pip install tensorboard`')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    args.checkpoint = args.checkpoint_opt or args.checkpoint
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main(argv=None):
    try:
        return _test(parse_args(argv))
    except CheckpointFileError as err:  # damaged, truncated or not a checkpoint: one line
        raise SystemExit(f'error: {err}') from None


def _test(args):
    keep_freed_memory_on_cpu()
    if args.out:
        check_out_path(args.out)
    cfg = load_config(args.config, args.cfg_options, args.allow_new_keys)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.checkpoint is not None:
        if not osp.isfile(args.checkpoint):
            raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
        check_checkpoint_file(args.checkpoint)  # before the runner writes its log folder
        cfg.load_from = args.checkpoint
    if args.tensorboard:
        add_tensorboard(cfg)
    check_runner_args(cfg)
    check_data_roots(cfg)
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg)
    if cfg.get('load_from'):  # the runner loads non-strictly: a checkpoint must fit the model
        from mmdinomamba.models.utils import load_checkpoint_strict
        load_checkpoint_strict(runner.model, cfg.load_from)
    metrics = runner.test()
    if args.out:
        dump_metrics(metrics, args.out)
    del runner  # before the process group goes (see finish_distributed)
    finish_distributed()
    return metrics


if __name__ == '__main__':
    main()
