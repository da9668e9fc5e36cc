"""The README's main job: DINO-pretrain a small backbone on CPU, then measure what it learned.

1. data: the generated embedded data set (``data/embedded``, made when missing), or a folder of
   your own in the same layout (``--data-root DIR``: ``classes.txt``, ``meta/{train,val}.txt``,
   ``train/``, ``val/``, optional ``masks/{train,val}/``), read as it is and never written to;
2. pretrain with ``tools/train.py`` on the demo DINO config (written, with the data folder filled
   in, to ``<work-dir>/<mixer>/pretrain_config.py``); the teacher's Binary-AUC per layer is
   recorded every few iterations when the data have masks;
   settings that depend on the data (length, colour augmentation, crop scales) are derived from
   measurements of the train split (:mod:`mmdinomamba.demo.recipe`; ``--no-adapt``: the config
   as it is), before your ``--cfg-options``;
3. train the same backbone supervised (cross-entropy on the labels, same data, image size,
   batch and epochs; ``--no-supervised`` skips it), the paper's Figure 4(a) baseline;
4. evaluate the DINO teacher, the supervised backbone and the backbone at random init
   (``--seeds`` seeds) with frozen features: k-NN (DINO's: cosine, k = 20, T = 0.07), a linear
   probe (logistic regression by L-BFGS) and Binary-AUC per layer;
5. write ``report.md``, ``summary.json`` and PNG figures into ``<work-dir>``.

Exit status: 0; 3 when the collapse monitor stopped a pretraining (the teacher at that iteration
is evaluated all the same and the report has a ``collapse`` entry); 1 on any other failure (no
report).

Usage::

    python tools/demo.py                                  # what `make demo` runs
    python tools/demo.py --data-root /path/to/my_data     # your own data, same layout
    python tools/demo.py --mixers dinovim vit linearvit   # the same recipe for three mixers
    python tools/demo.py --skip-pretrain                  # re-evaluate the last pretraining
"""
import argparse
import copy
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

from mmdinomamba.models.utils.checkpoint_file import CheckpointFileError  # noqa: E402
from mmdinomamba.utils.cli import DictAction  # noqa: E402
from mmdinomamba.utils.files import WorkDirWriteError, explain_write_errors  # noqa: E402
from mmdinomamba.utils.processes import (end_child, ending_children_on_signals,  # noqa: E402
                                         start_child)
from mmdinomamba.utils.workdir_lock import WorkDirInUseError, work_dir_lock  # noqa: E402

CONFIGS = {
    'dinovim': 'configs/pretrain/dino_dinovim-demo_*embedded*.py',
    'vit': 'configs/pretrain/dino_vit-demo_*embedded*.py',
    'linearvit': 'configs/pretrain/dino_linearvit-demo_*embedded*.py',
}
DEFAULT_DATA = 'data/embedded'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', default='work_dirs/demo', help='where everything goes')
    p.add_argument('--data-root', help='a data folder of your own (read only); default: the '
                   f'embedded data set in {DEFAULT_DATA}, generated when missing')
    p.add_argument('--overwrite-data', action='store_true',
                   help=f'regenerate {DEFAULT_DATA} if it was made with other parameters')
    p.add_argument('--skip-binary-auc', action='store_true',
                   help='no Binary-AUC, even if the data folder has masks/ (with masks/, every '
                   'val image needs its mask)')
    p.add_argument('--mixers', nargs='+', default=['dinovim'], choices=sorted(CONFIGS),
                   help='token mixers to pretrain with the same recipe (default: dinovim)')
    p.add_argument('--seeds', type=int, default=3, help='random-init seeds of the baseline')
    p.add_argument('--pretrain-config', help='pretraining config (one mixer only)')
    p.add_argument('--skip-pretrain', action='store_true',
                   help="reuse the last checkpoint of an earlier run's pretraining")
    p.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                   help='overrides of the pretraining config, e.g. train_cfg.max_epochs=2')
    p.add_argument('--allow-new-keys', action='store_true',
                   help='let --cfg-options add keys that the config does not define')
    p.add_argument('--no-adapt', action='store_true',
                   help='use the pretraining config as it is (no settings derived from the data)')
    p.add_argument('--no-supervised', action='store_true',
                   help='skip the supervised baseline')
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error('--seeds must be >= 1')
    if args.pretrain_config and len(args.mixers) > 1:
        p.error('--pretrain-config goes with one mixer')
    return args


def find_config(mixer: str, path=None) -> str:
    if path:
        return path
    found = sorted(glob.glob(osp.join(ROOT, CONFIGS[mixer])))
    if not found:
        raise SystemExit(f'no demo pretraining config matches {CONFIGS[mixer]}')
    return osp.relpath(found[0], ROOT)


def prepare(args):
    """The data folder: generated embedded data, an embedded set elsewhere, or your own."""
    from mmdinomamba.demo.data import prepare_data
    if args.data_root is None:
        return prepare_data(DEFAULT_DATA, generate=True, overwrite=args.overwrite_data,
                            skip_masks=args.skip_binary_auc)
    if not osp.isdir(args.data_root):
        raise SystemExit(f'--data-root {args.data_root} does not exist (to generate the '
                         'embedded data there: python tools/misc/make_embedded_data.py --root '
                         f'{args.data_root})')
    if args.overwrite_data:
        raise SystemExit('--overwrite-data only applies to the generated embedded data; your '
                         '--data-root folder is never rewritten')
    return prepare_data(args.data_root, generate=False, skip_masks=args.skip_binary_auc)


def run_config(base: str, data, run_dir: str, options: dict, allow_new_keys: bool = False
               ) -> str:
    """Write the pretraining config of this run: ``base`` with the data folder filled in (and,
    without masks, no Binary-AUC hook). Returns its path."""
    from mmdinomamba.utils.cli import load_config
    cfg = load_config(osp.join(ROOT, base), options or None, allow_new_keys)
    dataset = cfg.train_dataloader.dataset
    dataset.update(type=data.dataset_type, data_root=data.root)
    if data.generated:
        dataset['generate'] = False
    else:  # a folder of the user's: its dataset type takes no `generate`
        dataset.pop('generate', None)
    hooks = []
    for hook in cfg.get('custom_hooks', []):
        if hook['type'] == 'BinaryAUCHook':
            if not data.has_masks:
                continue
            hook = copy.deepcopy(hook)
            hook['dataloader']['dataset'].update(type=data.dataset_type, data_root=data.root)
            if data.generated:
                hook['dataloader']['dataset']['generate'] = False
        hooks.append(hook)
    cfg.custom_hooks = [_demo_monitor(h) for h in hooks]
    imports = cfg.setdefault('custom_imports', dict(imports=[], allow_failed_imports=False))
    imports['imports'] = list(imports.get('imports', [])) + ['mmdinomamba.demo.collapse']
    os.makedirs(run_dir, exist_ok=True)
    path = osp.join(run_dir, 'pretrain_config.py')
    cfg.dump(path)
    return path


def _demo_monitor(hook: dict) -> dict:
    """The collapse monitor that leaves the collapsed teacher and a record (same arguments)."""
    if hook['type'] != 'DINOCollapseMonitorHook':
        return hook
    return dict(hook, type='DemoCollapseMonitorHook')


def adapt_options(args, data):
    """The pretraining options: settings derived from the data, then ``--cfg-options``.
    Returns ``(options, adapt)``; ``adapt`` (measurements, derived options, reasons) is None
    with ``--no-adapt``."""
    if args.no_adapt:
        return args.cfg_options, None
    from mmdinomamba.demo.recipe import (derive_settings, kept_reasons, measure_data,
                                         merge_options)
    measured = measure_data(data.root)
    derived, why = derive_settings(measured)
    options, kept = merge_options(derived, args.cfg_options)
    reasons = kept_reasons(why, kept)
    print('[demo] settings from the data: ' + ('; '.join(reasons) or 'none (all set by '
                                                '--cfg-options)'), flush=True)
    return options, dict(measured=measured, options=kept, reasons=reasons)


def _mtime(path: str) -> float:
    return osp.getmtime(path) if osp.exists(path) else 0.


class Progress:
    """Turns mmengine's training log lines into one short console line each."""
    LINE = re.compile(r'Epoch\(train\)\s*\[(\d+)\]\s*\[\s*(\d+)/(\d+)\]')
    KEYS = (('eta', 'eta'), ('loss', 'loss'), ('teacher_entropy', 'H/image'),
            ('teacher_batch_entropy', 'H/batch'), ('prototypes_used', 'prototypes'))

    def __init__(self, name: str, max_epochs: int, verb: str = 'pretrain'):
        self.name, self.max_epochs, self.verb = name, max_epochs, verb

    @staticmethod
    def _short(value: str) -> str:
        try:
            x = float(value)
        except ValueError:
            return value
        return f'{x:.0f}' if abs(x) >= 10 else f'{x:.2f}'

    def format(self, line: str):
        m = self.LINE.search(line)
        if not m:
            auc = re.search(r'Binary-AUC of the teacher backbone at iter (\d+).*?\'(?:binary_auc/)?'
                            r'auc\': ([0-9.]+)', line)
            return f'[demo] {self.name} Binary-AUC at iteration {auc[1]}: {auc[2]}' if auc \
                else None
        epoch, i, n = (int(g) for g in m.groups())
        done, total = (epoch - 1) * n + i, self.max_epochs * n
        parts = [f'[demo] {self.name} {self.verb} {done}/{total} ({100 * done / total:.0f}%)']
        for key, label in self.KEYS:
            v = re.search(rf'\b{key}: (\S+)', line)
            if v:
                parts.append(f'{label} {self._short(v[1])}')
        return ' | '.join(parts)


def run(cmd, log_path: str, progress=None) -> float:
    """Run ``cmd`` in the repository, its output into ``log_path``; short lines on the
    console. Returns the wall time. The child runs in its own process group and ends with the
    demo (:mod:`mmdinomamba.utils.processes`): on SIGTERM / SIGINT, on an error, and (Linux)
    when the demo is killed."""
    print(f'[demo] $ {" ".join(cmd)}\n[demo]   full log: {log_path}', flush=True)
    start = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    with explain_write_errors(log_path, 'the log'):
        log = open(log_path, 'w')
    with log:
        proc = start_child(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        try:
            for line in proc.stdout:
                with explain_write_errors(log_path, 'the log'):
                    log.write(line)
                short = progress.format(line) if progress else None
                if short:
                    print(short, flush=True)
                elif 'Error' in line or 'error:' in line:
                    print(f'  {line.rstrip()}', flush=True)
            proc.wait()
        finally:
            end_child(proc)
    if proc.returncode:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f'[demo] failed (exit {proc.returncode}); end of {log_path}:\n{tail}')
    return time.perf_counter() - start


def read_scalars(work_dir: str) -> list:
    """The scalars mmengine logged in the newest run of ``work_dir``."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        return []
    with open(files[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def last_checkpoint(work_dir: str) -> str:
    marker = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(marker):
        raise SystemExit(f'no checkpoint in {work_dir} (missing {marker}); run without '
                         '--skip-pretrain')
    with open(marker) as f:
        return f.read().strip()


def pretrain(mixer: str, args, cfg_path: str, cfg, run_dir: str, times: dict):
    """DINO pretraining (unless ``--skip-pretrain``). Returns ``(checkpoint, collapse)``: the
    teacher to evaluate, and the collapse record (None when none stopped the run)."""
    from mmdinomamba.demo.collapse import read_collapse
    train_dir = osp.join(run_dir, 'pretrain')
    if args.skip_pretrain:
        collapse = read_collapse(train_dir, since=_mtime(osp.join(train_dir, 'last_checkpoint')))
    else:
        t0, start = time.time(), time.perf_counter()
        try:
            times[f'{mixer}: pretrain'] = run(
                [sys.executable, 'tools/train.py', cfg_path, '--work-dir', train_dir],
                osp.join(run_dir, 'pretrain.log'), Progress(mixer, cfg.train_cfg.max_epochs))
            collapse = None
        except SystemExit:
            collapse = read_collapse(train_dir, since=t0)
            if collapse is None:
                raise
            times[f'{mixer}: pretrain'] = time.perf_counter() - start
    if collapse:
        stopped = collapse.get('stopped_at_iteration', collapse['iteration'])
        print(f'[demo] {mixer}: {collapse["kind"]} collapse of the teacher at iteration '
              f'{collapse["iteration"]}, pretraining stopped at iteration {stopped}; evaluating '
              f'that teacher all the same ({collapse["checkpoint"]})', flush=True)
        return collapse['checkpoint'], collapse
    return last_checkpoint(train_dir), None


def supervised(mixer: str, args, data, cfg, run_dir: str, times: dict):
    """The supervised baseline's checkpoint (trained unless ``--skip-pretrain`` finds one), or
    None with ``--no-supervised``."""
    from mmdinomamba.demo.supervised import supervised_config
    if args.no_supervised:
        return None
    train_dir = osp.join(run_dir, 'supervised')
    if args.skip_pretrain and osp.isfile(osp.join(train_dir, 'last_checkpoint')):
        return last_checkpoint(train_dir)
    path = supervised_config(ROOT, data, cfg, run_dir)
    times[f'{mixer}: supervised'] = run(
        [sys.executable, 'tools/train.py', path, '--work-dir', train_dir],
        osp.join(run_dir, 'supervised.log'), Progress(mixer, cfg.train_cfg.max_epochs,
                                                      'supervised'))
    return last_checkpoint(train_dir)


def pretrain_and_evaluate(mixer: str, args, data, run_dir: str, times: dict,
                          options: dict = None) -> dict:
    """One mixer: pretraining and the supervised baseline, then the evaluations of the
    teacher, the supervised backbone and random init."""
    from mmengine.config import Config

    from mmdinomamba.demo.evaluate import DemoLoaders, build_backbone, evaluate_backbone
    from mmdinomamba.demo.supervised import PREFIX
    base = find_config(mixer, args.pretrain_config)
    options = args.cfg_options if options is None else options
    cfg_path = run_config(base, data, run_dir, options, args.allow_new_keys)
    cfg = Config.fromfile(cfg_path)
    ckpt, collapse = pretrain(mixer, args, cfg_path, cfg, run_dir, times)
    sup_ckpt = supervised(mixer, args, data, cfg, run_dir, times)
    start = time.perf_counter()
    bb_cfg = cfg.model.backbone.to_dict()
    loaders = DemoLoaders(data, bb_cfg['img_size'])
    print(f'[demo] {mixer}: evaluating the teacher and {args.seeds} random-init seeds',
          flush=True)
    teacher = evaluate_backbone(build_backbone(bb_cfg, ckpt), loaders, num_examples=4)
    sup = None if sup_ckpt is None else evaluate_backbone(
        build_backbone(bb_cfg, sup_ckpt, prefix=PREFIX), loaders, num_examples=4)
    randoms = [evaluate_backbone(build_backbone(bb_cfg, seed=s), loaders,
                                 num_examples=4 if s == 0 else 0) for s in range(args.seeds)]
    times[f'{mixer}: evaluation'] = time.perf_counter() - start
    return dict(config=base, cfg=cfg, teacher=teacher, random=randoms, loaders=loaders,
                scalars=read_scalars(osp.join(run_dir, 'pretrain')), checkpoint=ckpt,
                bb_cfg=bb_cfg, supervised=sup, supervised_checkpoint=sup_ckpt,
                collapse=collapse)


def main(argv=None) -> None:
    """The demo, alone in its work dir (a second run there is refused, naming this one) and
    with its children ended when it ends (SIGTERM, SIGINT, an error). A full disk or a folder
    without permission is an error naming the file being written."""
    args = parse_args(argv)
    wd = osp.abspath(args.work_dir)
    try:
        with ending_children_on_signals('[demo] '), \
                explain_write_errors(wd, "the demo's outputs"), \
                work_dir_lock(wd, log=lambda msg: print(f'[demo] {msg}', flush=True)):
            demo(args, wd)
    except (WorkDirInUseError, WorkDirWriteError, CheckpointFileError) as err:
        raise SystemExit(f'[demo] error: {err}') from None


def demo(args, wd: str) -> None:
    start = time.perf_counter()
    times = {}
    data = prepare(args)
    times['data'] = time.perf_counter() - start
    print(f'[demo] data: {data.root} ({len(data.classes)} classes, {data.num_images} images, '
          f'masks: {"yes" if data.has_masks else "no: Binary-AUC is skipped"})', flush=True)
    from mmdinomamba.demo.collapse import EXIT_COLLAPSE
    from mmdinomamba.demo.outputs import write_outputs
    options, adapt = adapt_options(args, data)
    runs = {}
    for mixer in args.mixers:
        run_dir = wd if len(args.mixers) == 1 else osp.join(wd, mixer)
        runs[mixer] = pretrain_and_evaluate(mixer, args, data, run_dir, times, options)
        runs[mixer]['adapt'] = adapt
    report = write_outputs(wd, runs, data, times, start)
    print(report)
    print(f'[demo] report: {osp.join(wd, "report.md")}; summary: '
          f'{osp.join(wd, "summary.json")}')
    collapsed = [m for m, r in runs.items() if r['collapse']]
    if collapsed:
        print(f'[demo] the teacher collapsed ({", ".join(collapsed)}): exit status '
              f'{EXIT_COLLAPSE}; see the collapse entry of the report', flush=True)
        sys.exit(EXIT_COLLAPSE)


if __name__ == '__main__':
    main()
