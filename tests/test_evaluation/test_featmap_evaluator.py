"""FeatMapEvaluator: checkpoint key remapping, configs, and tools/test.py end to end."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mmdinomamba  # noqa: F401  (registration)
from mmdinomamba.models.utils import load_checkpoint_strict
from repo_files import load_file

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'analysis', '*.py')))
TINY_VIT = dict(type='ViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32,
                patch_size=8)


def _evaluator(**kw):
    return MODELS.build(dict(type='FeatMapEvaluator', backbone=dict(TINY_VIT), **kw))


def _randomized(model, seed):
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) for k, v in model.backbone.state_dict().items()}


@pytest.mark.parametrize('layout', ['dino', 'ema', 'student', 'bare'])
def test_checkpoint_keys_are_remapped(tmp_path, layout):
    model = _evaluator()
    student, teacher = _randomized(model, 1), _randomized(model, 2)
    pre = {'dino': 'teacher.backbone.', 'ema': 'teacher.module.backbone.'}.get(layout)
    state = {f'backbone.{k}': v for k, v in student.items()} if layout != 'bare' else {
        k: v for k, v in student.items()}
    if pre:
        state.update({pre + k: v for k, v in teacher.items()})
        state['head.last_layer.weight'] = torch.zeros(3)  # DINO head keys are ignored
        state['dino_loss.center'] = torch.zeros(1, 3)
    torch.save(dict(state_dict=state), tmp_path / 'ckpt.pth')
    load_checkpoint_strict(model, str(tmp_path / 'ckpt.pth'))  # no missing / unexpected key
    expected = teacher if pre else student
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_forward_modes():
    model = _evaluator(layers=[0, 1], head_reduce='mean').eval()
    maps = model(torch.randn(2, 3, 32, 32), mode='tensor')
    assert maps.shape == (2, 2, 1, 1, 4, 4)
    samples = model(torch.randn(2, 3, 32, 32), mode='predict')
    assert samples[0].pred_featmap.shape == (2, 1, 1, 4, 4)
    assert samples[0].featmap_layers == [0, 1] and samples[0].featmap_type == 'mixing'
    with pytest.raises(RuntimeError, match='evaluation-only'):
        model(torch.randn(1, 3, 32, 32), mode='loss')


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_analysis_configs_build(path):
    cfg = Config.fromfile(path)
    assert cfg.model.type == 'FeatMapEvaluator' and cfg.test_evaluator.type == 'BinaryAUC'
    assert cfg.test_dataloader.dataset.pipeline[-1].algorithm_keys == ['gt_seg_map']
    backbone = dict(cfg.model.backbone)
    small = dict(embed_dims=32, num_layers=2)
    if backbone['type'] in ('ViT', 'LinearViT'):
        small['num_heads'] = 2
    else:
        backbone['mixer_cfg'] = dict(d_state=8, headdim=16)
    backbone.update(arch=small, img_size=32)
    model = MODELS.build(dict(cfg.model, backbone=backbone))
    assert model.featmap_cfg['map_type'] == 'mixing'


def test_tools_test_prints_binary_auc(tmp_path, embedded_root):
    test_tool = load_file('tools/test.py')
    cfg = Config.fromfile(osp.join(REPO, 'configs/analysis/binary-auc_dinovim-demo_embedded.py'))
    model = MODELS.build(cfg.model)
    state = {'teacher.backbone.' + k: v for k, v in model.backbone.state_dict().items()}
    torch.save(dict(state_dict=state), tmp_path / 'dino.pth')
    data = 'test_dataloader.dataset.'
    metrics = test_tool.main([
        osp.join(REPO, 'configs/analysis/binary-auc_dinovim-demo_embedded.py'), '--checkpoint',
        str(tmp_path / 'dino.pth'), '--work-dir', str(tmp_path / 'work'), '--allow-new-keys',
        '--cfg-options', f'{data}data_root={embedded_root}', f'{data}num_train=48',
        f'{data}num_val=16', f'{data}img_size=64', 'test_dataloader.batch_size=8'])
    assert metrics['binary_auc/num_images'] == 16
    for layer in range(4):
        assert 0 <= metrics[f'binary_auc/auc/layer_{layer}'] <= 100
    assert 50 <= metrics['binary_auc/auc_norm'] <= 100
    assert {f'binary_auc/auc/head_{h}' for h in range(8)} <= set(metrics)  # 128 / 16 heads


def test_random_init_baseline_is_the_same_model_every_run(tmp_path):
    """The demo's random-init Binary-AUC baseline runs tools/test.py without a checkpoint; the
    config's seed must make that the same model in every run (so the report is repeatable)."""
    from mmengine.runner import Runner
    cfg_file = osp.join(REPO, 'configs/analysis/binary-auc_dinovim-demo_embedded.py')
    states = []
    for i in range(2):
        cfg = Config.fromfile(cfg_file)
        cfg.work_dir = str(tmp_path / f'run{i}')
        torch.manual_seed(i)  # whatever the global RNG state was before
        states.append(Runner.from_cfg(cfg).model.backbone.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_visualize_featmap_tool(tmp_path, embedded_root):
    tool = load_file('tools/analysis/visualize_featmap.py')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        f"_base_ = '{REPO}/configs/analysis/binary-auc_dinovim-demo_embedded.py'\n"
        "model = dict(backbone=dict(_delete_=True, type='MambaReg', arch=dict(embed_dims=32, "
        "num_layers=2), mixer_cfg=dict(d_state=8, headdim=16), num_registers=2, img_size=64, "
        "patch_size=16))\n"
        f"test_dataloader = dict(dataset=dict(data_root='{embedded_root}', num_train=48, "
        "num_val=16, img_size=64))\n")
    out = tmp_path / 'out'
    aucs = tool.main([str(cfg), '--dataset-slice', '1:3', '--layers', '-1', '--out-dir', str(out),
                      '--device', 'cpu'])
    assert len(aucs) == 2
    for kind in ('maps', 'roc', 'pca'):
        files = sorted(out.glob(f'*_{kind}.png'))
        assert len(files) == 2 and all(f.stat().st_size > 1000 for f in files)


def test_backbone_init_cfg_is_applied(tmp_path):
    source = _evaluator()
    teacher = _randomized(source, 3)
    torch.save(dict(state_dict={'teacher.backbone.' + k: v for k, v in teacher.items()}),
               tmp_path / 'dino.pth')
    init_cfg = dict(type='Pretrained', checkpoint=str(tmp_path / 'dino.pth'),
                    prefix='teacher.backbone.')
    backbone = dict(TINY_VIT, init_cfg=init_cfg)
    model = MODELS.build(dict(type='FeatMapEvaluator', backbone=backbone))
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, teacher[k]), k


def test_evaluator_and_hook_evaluation_fill_the_same_fields(embedded_root):
    """``tools/test.py`` (FeatMapEvaluator) and ``BinaryAUCHook`` (``evaluate_binary_auc``) give
    BinaryAUC samples with the same maps and metainfo, and the same metric."""
    from mmengine.evaluator import Evaluator
    from mmpretrain.registry import DATASETS
    from torch.utils.data import DataLoader

    from mmdinomamba.analysis import evaluate_binary_auc
    model = _evaluator(layers=[0, 1]).eval()
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadFgMask'),
                dict(type='Resize', scale=(32, 32)),
                dict(type='PackInputs', algorithm_keys=['gt_seg_map'])]
    dataset = DATASETS.build(dict(type='EmbeddedShapes', data_root=str(embedded_root),
                                  split='val', with_mask=True, pipeline=pipeline))
    loader = DataLoader(dataset, batch_size=8, collate_fn=lambda batch: dict(
        inputs=[b['inputs'] for b in batch], data_samples=[b['data_samples'] for b in batch]))
    hook_metrics, examples = evaluate_binary_auc(model.backbone, loader, model.data_preprocessor,
                                                 dict(layers=[0, 1]), num_examples=1)
    from mmdinomamba.evaluation import BinaryAUC
    evaluator = Evaluator(BinaryAUC())
    for data in loader:
        samples = model.test_step(data)
        evaluator.process(samples, data)
    assert evaluator.evaluate(len(dataset)) == pytest.approx(hook_metrics)
    hook_sample = next(iter(loader))
    data = model.data_preprocessor(hook_sample, False)
    filled = model(data['inputs'], data['data_samples'])[0]
    assert set(filled.metainfo) >= {'featmap_layers', 'featmap_type', 'query_index'}
    torch.testing.assert_close(filled.pred_featmap, examples[0][1].float())
