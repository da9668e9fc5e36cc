"""``tools/dist_train.sh`` / ``dist_test.sh`` with 2 processes on CPU (gloo): the demo DINO config
trains one short epoch, then Binary-AUC is evaluated with both processes."""
import json
import os
import os.path as osp
import re
import socket
import subprocess
import sys

import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DINO = 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py'
AUC = 'configs/analysis/binary-auc_dinovim-demo_embedded.py'


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run(script, *args):
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(_free_port()), OMP_NUM_THREADS='1')
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU (gloo) path')
def test_two_processes_train_and_test_on_cpu(embedded_root, tmp_path):
    work = tmp_path / 'dino'
    log = _run('dist_train.sh', DINO, '2', '--work-dir', str(work), '--cfg-options',
               f'train_dataloader.dataset.data_root={embedded_root}',
               f'custom_hooks.3.dataloader.dataset.data_root={embedded_root}',
               'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
               'model.backbone.arch.num_layers=1', 'train_cfg.max_epochs=1',
               'default_hooks.logger.interval=1')
    assert 'Distributed training: True' in log
    # the step's numbers as mmengine logs them (memory: only with CUDA), every iteration
    steps = re.findall(r'Epoch\(train\) +\[1\]\[([0-9]) ?/3\].*?time: [0-9.]+ +data_time: '
                       r'[0-9.]+ +(memory: [0-9]+ +)?.*?loss: [0-9.]+', log)
    assert [int(i) for i, _ in steps] == [1, 2, 3], log[-3000:]
    assert all(bool(mem) == torch.cuda.is_available() for _, mem in steps)
    ckpt = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == 3  # 48 images / (2 processes x 8): both processes trained
    out = tmp_path / 'auc.json'
    _run('dist_test.sh', AUC, str(work / 'epoch_1.pth'), '2', '--work-dir',
         str(tmp_path / 'auc'), '--out', str(out), '--cfg-options',
         f'test_dataloader.dataset.data_root={embedded_root}', 'model.backbone.arch.num_layers=1')
    metrics = json.loads(out.read_text())
    assert metrics['binary_auc/num_images'] == 16  # the results of both processes
    assert 0 <= metrics['binary_auc/auc'] <= 100


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU (gloo) path')
def test_cpu_launch_settings():
    """Without CUDA a launched run uses gloo and a DDP wrapper without device ids (the process
    group itself is only initialized for the pytorch launcher)."""
    from mmengine.config import Config

    from mmdinomamba.utils.cli import setup_cpu_distributed
    cfg = Config(dict(launcher='slurm', env_cfg=dict(dist_cfg=dict(backend='nccl'))))
    setup_cpu_distributed(cfg)
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
    assert cfg.model_wrapper_cfg.device_ids is None
    cfg = Config(dict(launcher='none'))
    setup_cpu_distributed(cfg)
    assert 'env_cfg' not in cfg and 'model_wrapper_cfg' not in cfg


def test_scripts_pick_the_python(tmp_path):
    """$PYTHON first, else the project's .venv/bin/python, else python."""
    for script in ('dist_train.sh', 'dist_test.sh'):
        text = open(osp.join(REPO, 'tools', script)).read()
        assert '"$PYTHON" -m torch.distributed.run' in text
        assert '.venv/bin/python' in text and '${PYTHON:-}' in text
    fake = tmp_path / 'py'
    fake.write_text('#!/bin/sh\necho "fake python $*"\n')
    fake.chmod(0o755)
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), 'CFG', '2'],
                          env=dict(os.environ, PYTHON=str(fake)), capture_output=True, text=True)
    assert proc.stdout.startswith('fake python -m torch.distributed.run')
    assert '--nproc_per_node=2' in proc.stdout and 'CFG --launcher pytorch' in proc.stdout
