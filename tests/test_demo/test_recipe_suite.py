"""The data suite (deterministic, in the documented layout) and the settings the demo derives
from measurements of the data."""
import hashlib
import os
import os.path as osp

import pytest

from mmdinomamba.datasets.folder import check_folder_layout
from mmdinomamba.datasets.suite import SUITE, write_suite_set
from mmdinomamba.demo.recipe import (PLAIN_KOLEO, PLAIN_TEACHER_TEMP, derive_settings,
                                     kept_reasons, measure_data, merge_options)

PIPE = 'train_dataloader.dataset.pipeline.1.'


def _digest(root):
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            with open(osp.join(d, f), 'rb') as fh:
                h.update(osp.relpath(osp.join(d, f), root).encode() + fh.read())
    return h.hexdigest()


@pytest.fixture(scope='module')
def suite(tmp_path_factory):
    # 30 val images cover every class of every set (the labels are drawn at random)
    root = tmp_path_factory.mktemp('suite')
    for name in SUITE:
        write_suite_set(name, str(root / name), num_train=40, num_val=30, log=lambda s: None)
    return root


def test_suite_sets_are_deterministic_in_the_layout_and_never_overwritten(suite, tmp_path):
    for name, (classes, _, size, _, _) in SUITE.items():
        info = check_folder_layout(str(suite / name))
        assert info['classes'] == classes and info['has_masks']
        assert info['num_images'] == dict(train=40, val=30)
    again = tmp_path / 'strokes'
    write_suite_set('strokes', str(again), num_train=40, num_val=30, log=lambda s: None)
    assert _digest(str(again)) == _digest(str(suite / 'strokes'))
    with pytest.raises(FileExistsError, match='exists'):
        write_suite_set('strokes', str(again), log=lambda s: None)
    with pytest.raises(KeyError, match='unknown suite set'):
        write_suite_set('nope', str(tmp_path / 'x'))


def test_measurements_tell_the_kinds_of_data_apart(suite):
    m = {name: measure_data(str(suite / name)) for name in SUITE}
    assert m['strokes']['grayscale'] == 1. and m['strokes']['plain_background'] > 0.5
    assert m['strokes']['img_size'] == 32 and m['textures']['img_size'] == 80
    assert m['colours']['colour_class_eta2'] > 0.3  # the classes differ in colour only
    for name in ('shapes', 'textures'):  # random colours per image
        assert m[name]['grayscale'] == 0. and m[name]['colour_class_eta2'] < 0.3
        assert m[name]['plain_background'] < 0.5
    assert all(v['num_train'] == 40 for v in m.values())


def test_derived_settings_follow_the_measurements():
    base = dict(num_train=2400, img_size=64, grayscale=0., colourfulness=50.,
                colour_class_eta2=0.6, plain_background=0.1)
    opts, why = derive_settings(base)  # the embedded data's kind: the demo config's settings
    assert opts['train_cfg.max_epochs'] == 14 == opts['param_scheduler.1.end']
    assert opts[PIPE + 'color_jitter'] == dict(brightness=0.2, contrast=0.2, saturation=0.,
                                               hue=0.)
    assert opts[PIPE + 'grayscale_prob'] == 0. and PIPE + 'local_crops_scale' not in opts
    assert 'model.koleo_weight' not in opts and 'model.teacher_temp' not in opts
    opts, why = derive_settings(dict(base, colour_class_eta2=0.05, num_train=1200))
    assert opts['train_cfg.max_epochs'] == 28
    assert opts[PIPE + 'color_jitter']['hue'] == 0.1 and opts[PIPE + 'grayscale_prob'] == 0.2
    assert 'do not differ in colour' in ' '.join(why)
    opts, why = derive_settings(dict(base, grayscale=1., plain_background=0.8))
    assert opts[PIPE + 'color_jitter']['saturation'] == 0.
    assert opts[PIPE + 'local_crops_scale'] == (0.15, 0.5)
    assert opts['model.koleo_weight'] == PLAIN_KOLEO > 0
    assert any('plain background' in w for w in why)
    assert any('KoLeo' in w and why[w] == ['model.koleo_weight'] for w in why)
    assert opts['model.teacher_temp'] == PLAIN_TEACHER_TEMP == opts['model.warmup_teacher_temp']
    assert any('teacher temperature' in w for w in why)


def test_derived_settings_apply_to_every_demo_config_without_new_keys():
    from mmdinomamba.utils.cli import load_config
    opts, _ = derive_settings(dict(num_train=1400, img_size=32, grayscale=1., colourfulness=0.,
                                   colour_class_eta2=0., plain_background=0.9))
    root = osp.join(osp.dirname(__file__), '..', '..', 'configs', 'pretrain')
    for mixer in ('dinovim', 'vit', 'linearvit'):
        cfg = load_config(osp.join(root, f'dino_{mixer}-demo_1xb32-14e_embedded-64px.py'), opts)
        assert cfg.model.koleo_weight == PLAIN_KOLEO
        assert cfg.model.teacher_temp == PLAIN_TEACHER_TEMP == cfg.model.warmup_teacher_temp
        assert cfg.train_dataloader.dataset.pipeline[1].local_crops_scale == (0.15, 0.5)


def test_user_options_win_over_derived_ones():
    derived, why = derive_settings(dict(num_train=1400, img_size=32, grayscale=1.,
                                      colourfulness=0., colour_class_eta2=0.,
                                      plain_background=0.9))
    merged, kept = merge_options(derived, {'train_cfg.max_epochs': 2,
                                           PIPE + 'color_jitter.hue': 0.3})
    assert merged['train_cfg.max_epochs'] == 2
    assert 'param_scheduler.1.end' not in merged  # the length is the user's as a whole
    assert PIPE + 'color_jitter' not in merged and merged[PIPE + 'color_jitter.hue'] == 0.3
    assert merged[PIPE + 'local_crops_scale'] == (0.15, 0.5) == kept[PIPE + 'local_crops_scale']
    reasons = kept_reasons(why, kept)  # the report names only what was applied
    assert not any('epochs' in r for r in reasons) and any('plain' in r for r in reasons)
    assert any('grayscale' in r for r in reasons)  # partly kept (grayscale_prob, solarize)


def test_the_embedded_data_keep_the_demo_config_settings(tmp_path):
    from mmengine.config import Config

    from mmdinomamba.datasets.embedded import generate_embedded_dataset
    root = str(tmp_path / 'embedded')
    generate_embedded_dataset(root, num_train=300, num_val=12)
    opts, _ = derive_settings(dict(measure_data(root), num_train=2400))
    ref = Config.fromfile(osp.join(osp.dirname(__file__), '..', '..', 'configs', 'pretrain',
                                   'dino_dinovim-demo_1xb32-14e_embedded-64px.py'))
    crop = ref.train_dataloader.dataset.pipeline[1]
    assert opts['train_cfg.max_epochs'] == ref.train_cfg.max_epochs
    assert opts[PIPE + 'color_jitter'] == crop.color_jitter
    assert opts[PIPE + 'grayscale_prob'] == crop.grayscale_prob
    assert tuple(opts[PIPE + 'global_solarize_probs']) == tuple(crop.global_solarize_probs)
    assert PIPE + 'global_crops_scale' not in opts
    assert 'model.koleo_weight' not in opts and ref.model.koleo_weight == 0.
    assert 'model.teacher_temp' not in opts
