"""tools/gpu/saved_activations.py: the saved-bytes accounting and the per-layer isolation."""

import pytest
import torch
from repo_files import load_file


def _tool():
    return load_file('tools/gpu/saved_activations.py')


def test_saved_bytes_counts_each_storage_once():
    a = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(3, 5, requires_grad=True)
    # a * b saves a and b; a[0] * b[0] saves views of the same storages
    assert _tool().saved_bytes(lambda: ((a * b).sum() + (a[0] * b[0]).sum())) == 2 * 15 * 4


def test_per_layer_bytes_are_proportional_to_tokens(monkeypatch):
    """What one portable DinoVim-T layer keeps per image grows with the token count (parameters
    and the stem cancel out of the four-run difference). The reference scan keeps a state per
    chunk, a constant at these few tokens: chunks of one token make everything it keeps grow
    with the tokens, so the test sees the tool's arithmetic alone."""
    from mmdinomamba.ops.reference import ssd_chunked
    monkeypatch.setattr(ssd_chunked.ssd_scan_chunked, '__defaults__', (None, 1, True))
    tool = _tool()
    small = tool.per_layer_image('t', 32, 'portable', 'cpu')  # 5 tokens
    large = tool.per_layer_image('t', 64, 'portable', 'cpu')  # 17 tokens
    assert small > 0
    assert large / 17 == pytest.approx(small / 5, rel=0.15)


def test_no_gpu_without_interpret_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip('has CUDA')
    with pytest.raises(SystemExit, match='--interpret'):
        _tool().main(['--arch', 't', '--res', '32'])
