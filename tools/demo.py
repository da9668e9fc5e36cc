"""The README's main job, end to end on the embedded demo data (CPU, a few minutes on 2 cores).

1. generate the embedded data set (deterministic; skipped when it is already there);
2. DINO-pretrain a tiny DinoVim with ``tools/train.py`` (the demo pretrain config);
3. take the teacher backbone out of the checkpoint (``tools/model_converters/extract_backbone.py``);
4. Binary-AUC per layer of the teacher and of the same backbone at random initialization
   (``tools/test.py`` with the demo analysis config) and a figure of the CLS-to-patch maps;
5. linear probe of the teacher backbone and of the random-init backbone on the embedded labels;
6. write ``<work-dir>/report.md`` (also printed) with the loss curve summary, collapse signals,
   Binary-AUC and probe accuracies. Every step's full log is kept in ``<work-dir>/logs/``.

Usage::

    python tools/demo.py --work-dir work_dirs/demo            # what `make demo` runs
    python tools/demo.py --work-dir work_dirs/demo --skip-pretrain   # reuse step 2's checkpoint
"""
import argparse
import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

PRETRAIN_GLOB = 'configs/pretrain/dino_dinovim-demo_*embedded*.py'
AUC_CONFIG = 'configs/analysis/binary-auc_dinovim-demo_embedded.py'
PROBE_CONFIG = 'configs/linear_probe/linear-probe_dinovim-demo_embedded-64px.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dir', default='work_dirs/demo', help='where everything goes')
    parser.add_argument('--data-root', default='data/embedded',
                        help='embedded data folder (generated when missing)')
    parser.add_argument('--pretrain-config', help=f'default: the file matching {PRETRAIN_GLOB}')
    parser.add_argument('--skip-pretrain', action='store_true',
                        help="reuse the last checkpoint of an earlier run's pretraining")
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='extra --cfg-options for the pretraining, '
                        'e.g. train_cfg.max_epochs=2')
    return parser.parse_args(argv)


class Step:
    """Runs one command, streaming its output into ``logs/<name>.log`` and a short console line."""

    def __init__(self, work_dir: str):
        self.log_dir = osp.join(work_dir, 'logs')
        os.makedirs(self.log_dir, exist_ok=True)
        self.times = {}

    def run(self, name: str, cmd: list, echo: bool = False) -> None:
        log_path = osp.join(self.log_dir, f'{name}.log')
        print(f'[demo] {name}: {" ".join(cmd)}\n[demo]   log: {log_path}', flush=True)
        start = time.perf_counter()
        env = dict(os.environ, PYTHONUNBUFFERED='1')
        with open(log_path, 'w') as log, subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True) as proc:
            for line in proc.stdout:
                log.write(line)
                if echo or 'Epoch(' in line or 'Error' in line or 'error' in line:
                    print(f'  {line.rstrip()[-160:]}', flush=True)
        self.times[name] = time.perf_counter() - start
        if proc.returncode:
            tail = open(log_path).read()[-3000:]
            raise SystemExit(f'[demo] step {name!r} failed (exit {proc.returncode}); end of '
                             f'{log_path}:\n{tail}')
        print(f'[demo] {name}: done in {self.times[name]:.0f} s', flush=True)


def find_pretrain_config(path=None) -> str:
    if path:
        return path
    found = sorted(glob.glob(osp.join(ROOT, PRETRAIN_GLOB)))
    if not found:
        raise SystemExit(f'no demo pretrain config matches {PRETRAIN_GLOB}')
    return osp.relpath(found[0], ROOT)


def last_checkpoint(work_dir: str) -> str:
    marker = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(marker):
        raise SystemExit(f'no checkpoint in {work_dir} (missing {marker}); run without '
                         '--skip-pretrain')
    with open(marker) as f:
        return f.read().strip()


def read_scalars(work_dir: str) -> list:
    """The per-iteration scalars mmengine logged in the newest run of ``work_dir``."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        return []
    with open(files[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> None:
    args = parse_args(argv)
    wd = osp.abspath(args.work_dir)
    os.makedirs(wd, exist_ok=True)
    py = sys.executable
    step = Step(wd)
    start = time.perf_counter()
    data_opt = [f'train_dataloader.dataset.data_root={args.data_root}']

    step.run('1_data', [py, 'tools/misc/make_embedded_data.py', '--root', args.data_root],
             echo=True)

    pre_cfg = find_pretrain_config(args.pretrain_config)
    pre_dir = osp.join(wd, 'pretrain')
    if not args.skip_pretrain:
        step.run('2_pretrain', [py, 'tools/train.py', pre_cfg, '--work-dir', pre_dir,
                                '--cfg-options', *data_opt, *args.cfg_options])
    ckpt = last_checkpoint(pre_dir)
    teacher = osp.join(wd, 'teacher_backbone.pth')
    step.run('3_extract', [py, 'tools/model_converters/extract_backbone.py', ckpt, teacher,
                           '--part', 'teacher'], echo=True)

    test_opt = [f'test_dataloader.dataset.data_root={args.data_root}']
    aucs = {}
    for tag, extra in (('teacher', ['--checkpoint', ckpt]), ('random', [])):
        out = osp.join(wd, f'binary_auc_{tag}.json')
        step.run(f'4_binary_auc_{tag}', [py, 'tools/test.py', AUC_CONFIG, *extra, '--work-dir',
                                         osp.join(wd, f'binary_auc_{tag}'), '--out', out,
                                         '--cfg-options', *test_opt])
        with open(out) as f:
            aucs[tag] = json.load(f)
    fig_dir = osp.join(wd, 'featmaps')
    step.run('4_featmap_figure', [py, 'tools/analysis/visualize_featmap.py', AUC_CONFIG, ckpt,
                                  '--dataset-slice', '0:4', '--layers', '-1', '--head-reduce',
                                  'mean', '--out-dir', fig_dir, '--cfg-options', *test_opt])

    probes = {}
    for tag, init in (('teacher', f'model.backbone.init_cfg.checkpoint={teacher}'),
                      ('random', 'model.backbone.init_cfg=None')):
        probe_dir = osp.join(wd, f'probe_{tag}')
        step.run(f'5_probe_{tag}', [py, 'tools/train.py', PROBE_CONFIG, '--work-dir', probe_dir,
                                    '--cfg-options', init, *data_opt,
                                    f'val_dataloader.dataset.data_root={args.data_root}'])
        probes[tag] = read_scalars(probe_dir)

    from mmdinomamba.utils.demo_report import write_report
    report = write_report(
        wd, pretrain_config=pre_cfg, scalars=read_scalars(pre_dir), aucs=aucs, probes=probes,
        figures=sorted(glob.glob(osp.join(fig_dir, '*.png'))), times=step.times,
        total=time.perf_counter() - start)
    print(report)
    print(f'[demo] report written to {osp.join(wd, "report.md")}')


if __name__ == '__main__':
    main()
