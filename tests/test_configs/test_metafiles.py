"""``model-index.yml`` and the folders' ``metafile.yml`` describe the shipped configs truthfully,
and ``import mmdinomamba`` puts them into mmpretrain's model zoo: ``list_models`` finds them and
``get_model`` builds them."""
import os.path as osp
import re

import pytest
import yaml
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _models():
    index = yaml.safe_load(open(osp.join(REPO, 'model-index.yml')))
    models = []
    for meta in index['Import']:
        data = yaml.safe_load(open(osp.join(REPO, meta)))
        collections = {c['Name'] for c in data['Collections']}
        for model in data['Models']:
            assert model['In Collection'] in collections, (meta, model['Name'])
            models.append((meta, model))
    return models


MODELS = _models()


def test_entries_name_existing_configs():
    names = [m['Name'] for _, m in MODELS]
    assert len(names) == len(set(names))
    for meta, model in MODELS:
        config = model['Config']
        assert osp.isfile(osp.join(REPO, config)), (meta, config)
        assert osp.dirname(config) == osp.dirname(meta)  # each folder describes its own
        assert model['Name'] == osp.splitext(osp.basename(config))[0]
        assert model.get('Weights') is None  # no weights are published


@pytest.mark.parametrize('meta,model', MODELS, ids=[m['Name'] for _, m in MODELS])
def test_metadata_matches_the_config(meta, model):
    cfg = Config.fromfile(osp.join(REPO, model['Config']))
    info = model.get('Metadata', {})
    if 'Epochs' in info:
        assert cfg.train_cfg.max_epochs == info['Epochs']
    if 'Batch Size' in info:
        gpus = re.search(r'_(\d+)xb(\d+)', model['Name'])
        per_gpu = cfg.train_dataloader.batch_size
        assert int(gpus.group(2)) == per_gpu
        assert int(gpus.group(1)) * per_gpu == info['Batch Size']


def test_model_zoo_lists_and_builds_the_models():
    from mmpretrain import get_model, list_models
    from mmpretrain.apis import ModelHub
    listed = list_models('*dinovim*')
    assert 'dino_dinovim-t-p16_4xb48-100e_in1k' in listed
    assert set(m['Name'] for _, m in MODELS) <= set(list_models())
    assert osp.realpath(ModelHub.get('mila-t_16xb64_in1k').config.filename) == \
        osp.join(REPO, 'configs/mila/mila-t_16xb64_in1k.py')
    for name, kind in (('dino_dinovim-demo_1xb32-14e_embedded-64px', 'DINO'),
                       ('linear-probe_dinovim-demo_embedded-64px', 'LinearProbe'),
                       ('dinovim-demo_1xb32-5e_embedded-64px', 'ImageClassifier'),
                       ('mila-demo_1xb16-2e_embedded', 'ImageClassifier')):
        assert type(get_model(name)).__name__ == kind


def test_registration_is_idempotent():
    from mmdinomamba.utils.model_index import register_model_index
    assert register_model_index() and register_model_index()
