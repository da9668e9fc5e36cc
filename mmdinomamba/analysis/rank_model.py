"""Model side of the block-rank analysis: per-layer views of ``M`` for any backbone.

For each analyzed layer the mixer's exact input is captured with a forward pre-hook during one
backbone forward; then, per mixer kind (see :func:`mixer_views`), the matrices are built, cut to
the **patch tokens only** (cls / register / extra tokens are dropped, the remaining rows and
columns keep their sequence order, which is raster order for every layout of the trunk; a
lower-triangular M stays lower triangular) and split into C x C blocks by
:func:`~mmdinomamba.analysis.rank.block_ranks`. At 512 x 512 px with patch 16 this leaves
1024 tokens = 4 x 4 blocks of 256.
"""
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .rank import AS_USED, CAUSAL, block_masks, block_ranks, causal_mask, rank_bound

__all__ = ['mixer_kind', 'mixer_dims', 'capture_mixer_inputs', 'mixer_views', 'analyze_layer']

KIND_OF = {'SoftmaxAttention': 'softmax', 'LinearAttention': 'linear', 'BiSSD': 'mamba'}
SPECTRUM_BLOCK = (1, 0)  # the first sub-diagonal block (adjacent chunks): "typical" off-diag


def mixer_kind(mixer: nn.Module) -> str:
    """'softmax', 'linear', 'mamba' or 'other' (generic: no paper bound)."""
    return KIND_OF.get(type(mixer).__name__, 'other')


def mixer_dims(mixer: nn.Module) -> Dict[str, Optional[int]]:
    """``d_qk`` (query/key feature size per head) and ``d_state`` (SSM state size N)."""
    d_qk = getattr(mixer, 'qk_dim', None) or getattr(mixer, 'head_dims', None)
    return dict(d_qk=d_qk, d_state=getattr(mixer, 'd_state', None))


@contextmanager
def capture_mixer_inputs(mixers: Dict[int, nn.Module]) -> Iterator[Dict[int, tuple]]:
    """Record ``(x, hw)`` of every call of the given mixers (the last call wins).

    Args:
        mixers (dict[int, nn.Module]): layer index -> mixer.

    Yields:
        dict[int, tuple[Tensor, tuple | None]]: filled during the forward passes in the block.
    """
    seen: Dict[int, tuple] = {}
    handles = []
    for idx, mixer in mixers.items():
        def hook(_mod, args, kwargs, idx=idx):
            hw = args[1] if len(args) > 1 else kwargs.get('hw')
            seen[idx] = (args[0] if args else kwargs['x']).detach(), hw
        handles.append(mixer.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _ssd_views(mixer: nn.Module, x: Tensor, hw) -> Dict[Tuple[str, str], Tensor]:
    """BiSSD: ``M`` as used, the forward scan (causal), and ``L_M`` of each direction.

    From the mixer's public API only (``mixing_matrices``, ``decay_masks``). ``M`` as used is
    ``mixing_matrix``'s average ``(M_fwd + M_bwd) / 2`` (exact per direction, not an exact
    input-output map of the whole mixer: see ``BiSSD.mixing_matrix``). ``L_M`` as used: the
    forward mask below the diagonal, the (token-order) backward mask above it and ones on the
    diagonal; the forward M block (i > j) is ``L_M o (C B^T) o dt_j`` there.
    """
    mats = mixer.mixing_matrices(x, hw)
    masks = mixer.decay_masks(x, hw)
    lm_f, lm_b = masks['forward'], masks['backward']
    eye = torch.eye(lm_f.shape[-1], dtype=lm_f.dtype, device=lm_f.device)
    lm_used = torch.tril(lm_f, -1) + torch.triu(lm_b, 1) + eye
    m_used = (mats['forward'] + mats['backward']) / 2
    return {('M', AS_USED): m_used, ('M', CAUSAL): mats['forward'],
            ('L_M', AS_USED): lm_used, ('L_M', CAUSAL): lm_f}


def mixer_views(mixer: nn.Module, x: Tensor, hw) -> Dict[Tuple[str, str], Tensor]:
    """The matrices analyzed for one mixer input, keyed by ``(matrix, view)``.

    * softmax / linear attention / other: ``('M', AS_USED)`` = ``mixer.mixing_matrix`` (the
      non-causal matrix the backbone applies) and ``('M', CAUSAL)`` = ``L_Attn o M`` (Eq. 12).
    * mamba (``BiSSD``): ``('M', AS_USED)`` = ``mixing_matrix``, the average
      ``(M_fwd + M_bwd) / 2`` of the two directions' exact matrices (each direction scans its
      own values and is normalized before the average, so this combined map is the analysed
      object, not an exact input-output map); ``('M', CAUSAL)`` = the forward scan alone (exact
      for that direction); ``('L_M', view)`` the decay masks (forward; as used: forward below
      the diagonal, backward above it).

    Args:
        mixer (nn.Module): a token mixer following the contract.
        x (Tensor): (B, L, C) its input.
        hw (tuple[int, int] | None): patch grid.

    Returns:
        dict: ``(matrix, view) -> (B, heads, L, L)``.
    """
    if mixer_kind(mixer) == 'mamba':
        return _ssd_views(mixer, x, hw)
    m = mixer.mixing_matrix(x, hw)
    return {('M', AS_USED): m, ('M', CAUSAL): causal_mask(m)}


def _patch_order(patch_index: Tensor) -> Tensor:
    """Patch positions in sequence order (raster order for the trunk's layouts)."""
    return torch.sort(torch.as_tensor(patch_index, dtype=torch.long).flatten()).values


def _bound_grid(kind: str, matrix: str, view: str, dims: dict, res,
                lm_rank: Optional[Tensor]) -> Tensor:
    """Upper bound of every block's rank, (B, heads, nb, nb) float64 (``nan``: no bound).

    Diagonal blocks: C (paper: R_diag = C), except non-causal linear attention (D_QK).
    Off-diagonal blocks of M: Eq. 16 (softmax C, linear D_QK, mamba rank(L_M block) * N, capped
    at C). ``L_M``: 1 off the diagonal (one scalar decay per step and head).
    """
    c = float(res.block_size)
    diag = block_masks(res.num_blocks)['diag'].to(res.rank.device)
    off = torch.full(res.rank.shape, float('nan'), dtype=torch.float64, device=res.rank.device)
    if matrix == 'L_M':
        off.fill_(1.0)
    elif kind == 'mamba' and lm_rank is not None and dims['d_state'] is not None:
        off = torch.clamp(lm_rank.double() * dims['d_state'], max=c)
    elif kind in ('softmax', 'linear'):
        off.fill_(rank_bound(kind, res.block_size, d_qk=dims['d_qk']))
    on = min(c, dims['d_qk']) if kind == 'linear' and view == AS_USED and matrix == 'M' else c
    return torch.where(diag, torch.full_like(off, on), off)


@torch.no_grad()
def analyze_layer(mixer: nn.Module, x: Tensor, hw, patch_index: Tensor, heads: Sequence[int],
                  block_size: int = 256, rel_tol: float = 1e-6, abs_tol: float = 1e-8,
                  meta: Optional[dict] = None) -> Tuple[List[dict], Dict[tuple, Tensor]]:
    """Block ranks of every view of one layer's mixer for a batch of one or more images.

    Args:
        mixer (nn.Module): the layer's token mixer.
        x (Tensor): (B, L, C) captured mixer input.
        hw (tuple[int, int] | None): patch grid.
        patch_index (Tensor): (P,) patch token positions in the sequence.
        heads (Sequence[int]): heads of ``M`` to analyze.
        block_size, rel_tol, abs_tol: see :func:`~mmdinomamba.analysis.rank.block_ranks`.
        meta (dict, optional): extra columns copied into every record (model, layer, ...).

    Returns:
        tuple: records (one dict per image, head, view, matrix and block) and spectra
        ``{(matrix, view): (B, len(heads), C) singular values of block SPECTRUM_BLOCK}``.
    """
    kind, dims = mixer_kind(mixer), mixer_dims(mixer)
    order = _patch_order(patch_index).to(x.device)
    head_idx = torch.as_tensor(list(heads), dtype=torch.long, device=x.device)
    results = {}
    for key, m in mixer_views(mixer, x, hw).items():
        m = m.index_select(1, head_idx).index_select(2, order).index_select(3, order)
        results[key] = block_ranks(m, block_size, rel_tol, abs_tol)
        del m
    records, spectra = [], {}
    for (matrix, view), res in results.items():
        lm = results.get(('L_M', view))
        bound = _bound_grid(kind, matrix, view, dims, res, lm.rank if lm is not None else None)
        records += _records(res, matrix, view, kind, dims, heads, bound, meta or {})
        if res.num_blocks > max(SPECTRUM_BLOCK):
            spectra[(matrix, view)] = res.sv[..., SPECTRUM_BLOCK[0], SPECTRUM_BLOCK[1], :]
    return records, spectra


def _records(res, matrix: str, view: str, kind: str, dims: dict, heads: Sequence[int],
             bound, meta: dict) -> List[dict]:
    """Flatten a :class:`BlockRanks` of shape (B, heads, nb, nb) into per-block records."""
    masks = block_masks(res.num_blocks)
    kinds = ('diag', 'lower') if view == CAUSAL else ('diag', 'lower', 'upper')
    smax = res.sv[..., 0]
    out = []
    for b in range(res.rank.shape[0]):
        for hi, head in enumerate(heads):
            for r in range(res.num_blocks):
                for c in range(res.num_blocks):
                    bkind = next(k for k in kinds + ('upper', ) if masks[k][r, c])
                    if bkind not in kinds:
                        continue
                    out.append(dict(
                        meta, mixer=kind, matrix=matrix, view=view, image=b, head=int(head),
                        block_row=r, block_col=c, block=bkind, rank=int(res.rank[b, hi, r, c]),
                        rank_abs=int(res.rank_abs[b, hi, r, c]),
                        erank=float(res.erank[b, hi, r, c]), sigma_max=float(smax[b, hi, r, c]),
                        bound=float(bound[b, hi, r, c]),
                        C=res.block_size, d_qk=dims['d_qk'], d_state=dims['d_state'],
                        rel_tol=res.rel_tol, abs_tol=res.abs_tol, dropped=res.dropped))
    return out
