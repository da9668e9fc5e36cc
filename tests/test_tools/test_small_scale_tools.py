"""The two tools behind the small-scale DINO experiments: the second data set (flags on photos,
made differently from the embedded data) and the experiment loop ``dino_search.py``."""
import json
import os

import numpy as np
import pytest
from PIL import Image
from repo_files import load_file

from mmdinomamba.datasets.folder import check_folder_layout, mask_path, read_classes


@pytest.fixture(scope='module')
def flags_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('flags') / 'flags'
    # labels are drawn at random: 30 val images cover the 10 classes (checked by the layout)
    load_file('tools/misc/make_flags_data.py').main(
        ['--root', str(root), '--num-train', '24', '--num-val', '30', '--img-size', '32'])
    return root


def test_flags_layout_masks_and_determinism(flags_root, tmp_path):
    check_folder_layout(str(flags_root))
    assert len(read_classes(str(flags_root))) == 10
    rows = (flags_root / 'meta' / 'val.txt').read_text().split('\n')
    rel, label = rows[0].rsplit(maxsplit=1)
    img = np.asarray(Image.open(flags_root / 'val' / rel))
    mask = np.asarray(Image.open(mask_path(str(flags_root), 'val', rel)))
    assert img.shape == (32, 32, 3) and mask.shape == (32, 32)
    assert 0 < (mask > 0).mean() < 1  # a flag on a background
    again = tmp_path / 'again'
    load_file('tools/misc/make_flags_data.py').main(
        ['--root', str(again), '--num-train', '24', '--num-val', '30', '--img-size', '32'])
    assert (again / 'meta' / 'val.txt').read_text() == '\n'.join(rows)
    assert np.array_equal(np.asarray(Image.open(again / 'val' / rel)), img)


def test_flags_never_overwrites(flags_root):
    before = sorted(os.listdir(flags_root))
    with pytest.raises(SystemExit, match='exists'):
        load_file('tools/misc/make_flags_data.py').main(['--root', str(flags_root)])
    assert sorted(os.listdir(flags_root)) == before


def test_dino_search_runs_and_reports(flags_root, tmp_path):
    out = tmp_path / 'runs.jsonl'
    load_file('tools/analysis/dino_search.py').main(
        ['--data-root', str(flags_root), '--img-size', '32', '--local-size', '16', '--iters', '2',
         '--batch', '8', '--width', '32', '--depth', '1', '--out-dim', '16', '--hidden', '32',
         '--bottleneck', '16', '--eval-every', '1', '--seeds', '1', '--out', str(out)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert [c['it'] for c in row['curve']] == [1, 2]
    final = row['curve'][-1]
    for key in ('knn', 'linear', 'auc_mean'):
        assert 0 <= final[key] <= 100 and 0 <= row['random'][0][key] <= 100
    assert set(final['signals']) == {'teacher_entropy', 'teacher_batch_entropy',
                                      'prototypes_used'}
