"""CLS-to-patch feature maps of any backbone (paper Sec. 4.1, Figures 1, 3, 5, 7-11).

Every backbone follows the contract in ``docs/CONTRACTS.md``: ``forward_layers(x, layers,
with_mixing)`` returns per-layer final-normed tokens ``(B, L, C)``, the patch grid ``hw``, a
``layout`` (``cls_index``, ``register_index``, ``patch_index``) and per-layer mixing matrices
``M (B, heads, L, L)`` with ``Y = M X`` per head.

Map types (one map per layer, head and *query token*):

* ``'mixing'``: the query row of the layer's token-mixing matrix restricted to the patch
  columns, ``M[b, head, q, patch_index]``. For ``ViT`` these are the post-softmax attention
  weights (DINO's ``visualize_attention``); for ``LinearViT`` the row-normalized
  ``psi(q) psi(K)^T``; for ``DinoVim`` / ``MambaReg`` Mamba's implicit ("hidden") attention of the
  bidirectional SSD, i.e. the query row of ``BiSSD.mixing_matrix = (M_fwd + M_bwd) / 2``, the
  average of the two directions' matrices in token order: the patches *before* the query token
  are reached through the forward (lower-triangular) scan, the patches *after* it through the
  backward (upper-triangular) scan, so one row covers all patches. Each direction's matrix is
  exact for that direction (``M_dir @ v_dir`` is its scan output, ``BiSSD.mixing_matrices``);
  the average is the map analysed, not an exact input-output map of the mixer (each direction
  scans its own conv's values and is RMS-normalized and gated before the average). Mamba's
  entries can be negative and do not sum to one.
* ``'cosine'``: cosine similarity between the query token's feature and every patch feature of the
  layer output (after the final norm). With ``cosine_heads = k > 1`` the channels are split into
  ``k`` equal chunks ("heads") and one map is computed per chunk; default one map per layer.

Query tokens: the cls token (``R = 1``) or, for ``MambaReg`` (no cls), each register (``R = 12``;
Figure 7: one map per register). For a layout with neither (``MILA``) ``query='mean'`` gives one
map (``R = 1``): the mean of the patch queries' rows of ``M`` ('mixing'), or the cosine of the
mean-pooled patch feature to every patch ('cosine'). ``query='auto'`` picks registers when the
layout has any, else the cls token, else the mean.

Maps are min-max normalized to [0, 1] per image, layer, head and query token (``normalize=True``)
before any thresholding; ``head_reduce='mean'`` averages the raw maps over heads first (DINO's
``video_generation`` recipe), leaving one "head".
"""
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mmdinomamba.evaluation.auc import minmax_normalize

MAP_TYPES = ('mixing', 'cosine')


@dataclass
class FeatMaps:
    """Feature maps of a batch.

    Attributes:
        maps (Tensor): (B, num_layers, heads, R, h, w); R query tokens (cls or registers).
        layers (list[int]): absolute 0-based layer index of each entry of dim 1.
        query_index (list[int]): token position of each of the R query tokens (empty for
            ``query='mean'``: one map, the mean over the patch queries).
        map_type (str): 'mixing' or 'cosine'.
        normalized (bool): whether maps were min-max normalized to [0, 1] per map.
        patch_tokens (list[Tensor]): per layer (B, h*w, C) final-normed patch features (for PCA).
    """
    maps: Tensor
    layers: List[int]
    query_index: List[int]
    map_type: str
    normalized: bool
    patch_tokens: List[Tensor] = field(default_factory=list, repr=False)


QUERIES = ('auto', 'cls', 'registers', 'mean')


def resolve_query(layout, query: str = 'auto') -> str:
    """'auto' -> 'registers' if the layout has any, else 'cls' if it has one, else 'mean'."""
    if query not in QUERIES:
        raise ValueError(f'query must be one of {QUERIES}, got {query!r}')
    if query != 'auto':
        return query
    if len(getattr(layout, 'register_index', [])):
        return 'registers'
    return 'cls' if layout.cls_index is not None else 'mean'


def query_tokens(layout, query: str = 'auto') -> Tensor:
    """Token positions used as queries: the cls token, the registers or (``'mean'``) the patches.

    Args:
        layout: ``TokenLayout`` with ``cls_index``, ``register_index`` and ``patch_index``.
        query (str): 'auto' (see :func:`resolve_query`), 'cls', 'registers' or 'mean' (all
            patch tokens, whose maps are averaged into one).

    Returns:
        Tensor: (R,) long positions.
    """
    query = resolve_query(layout, query)
    regs = torch.as_tensor(getattr(layout, 'register_index', []), dtype=torch.long).flatten()
    if query == 'registers':
        if regs.numel() == 0:
            raise ValueError("query='registers' but the backbone layout has no register tokens")
        return regs
    if query == 'cls':
        if layout.cls_index is None:
            raise ValueError("query='cls' but the backbone layout has no cls token (use "
                             "query='registers', or 'mean' without registers)")
        return torch.tensor([int(layout.cls_index)], dtype=torch.long)
    return torch.as_tensor(layout.patch_index, dtype=torch.long).flatten()


def mixing_maps(mixing: Tensor, layout, hw, query: Tensor, mean_query: bool = False) -> Tensor:
    """Query rows of a mixing matrix over the patches.

    Args:
        mixing (Tensor): (B, heads, L, L) mixing matrix (rows = outputs).
        layout: token layout with ``patch_index`` (h*w,) in raster order.
        hw (tuple[int, int]): patch grid (h, w).
        query (Tensor): (R,) query token positions.
        mean_query (bool): average the R rows into one map. Defaults to False.

    Returns:
        Tensor: (B, heads, R, h, w) raw maps (R = 1 with ``mean_query``).
    """
    patch = torch.as_tensor(layout.patch_index, dtype=torch.long, device=mixing.device)
    rows = mixing.index_select(2, query.to(mixing.device)).index_select(3, patch)
    if mean_query:
        rows = rows.mean(dim=2, keepdim=True)
    return rows.reshape(*rows.shape[:3], *hw)


def cosine_maps(tokens: Tensor, layout, hw, query: Tensor, num_heads: int = 1,
                mean_query: bool = False) -> Tensor:
    """Cosine similarity of query features to patch features, per channel chunk.

    Args:
        tokens (Tensor): (B, L, C) layer output tokens.
        layout: token layout with ``patch_index``.
        hw (tuple[int, int]): patch grid (h, w).
        query (Tensor): (R,) query token positions.
        num_heads (int): number of equal channel chunks. Defaults to 1.
        mean_query (bool): one query, the mean of the R query features. Defaults to False.

    Returns:
        Tensor: (B, num_heads, R, h, w) similarities in [-1, 1] (R = 1 with ``mean_query``).
    """
    b, _, c = tokens.shape
    if c % num_heads:
        raise ValueError(f'cosine_heads={num_heads} does not divide the {c} channels')
    patch = torch.as_tensor(layout.patch_index, dtype=torch.long, device=tokens.device)
    q = tokens.index_select(1, query.to(tokens.device))
    if mean_query:
        q = q.mean(dim=1, keepdim=True)
    q = q.reshape(b, -1, num_heads, c // num_heads)
    p = tokens.index_select(1, patch).reshape(b, -1, num_heads, c // num_heads)
    sim = torch.einsum('brhc,bphc->bhrp', F.normalize(q, dim=-1), F.normalize(p, dim=-1))
    return sim.reshape(b, num_heads, q.shape[1], *hw)


def resolve_layers(layers: Optional[Sequence[int]], num_layers: int) -> List[int]:
    """Turn (possibly negative) layer indices into sorted-as-given absolute indices."""
    if layers is None:
        return list(range(num_layers))
    out = []
    for i in ([layers] if isinstance(layers, int) else layers):
        if not -num_layers <= int(i) < num_layers:
            raise ValueError(f'layer index {i} out of range for {num_layers} layers')
        out.append(int(i) % num_layers)
    return out


@torch.no_grad()
def compute_featmaps(backbone, inputs: Tensor, layers: Optional[Sequence[int]] = (-1, ),
                     map_type: str = 'mixing', query: str = 'auto', cosine_heads: int = 1,
                     head_reduce: Optional[str] = None, normalize: bool = True,
                     keep_tokens: bool = False) -> FeatMaps:
    """Feature maps of ``backbone`` for a batch of images.

    Args:
        backbone (nn.Module): a backbone with ``forward_layers`` and ``num_layers``.
        inputs (Tensor): (B, 3, H, W) normalized images.
        layers (Sequence[int] | None): layers (negative allowed); None = all. Defaults to (-1,).
        map_type (str): 'mixing' or 'cosine'. Defaults to 'mixing'.
        query (str): 'auto', 'cls', 'registers' or 'mean' (see :func:`resolve_query`).
            Defaults to 'auto'.
        cosine_heads (int): channel chunks for 'cosine'. Defaults to 1.
        head_reduce (str | None): None (per head) or 'mean' (mean over heads). Defaults to None.
        normalize (bool): min-max normalize each map to [0, 1]. Defaults to True.
        keep_tokens (bool): also return the patch tokens per layer. Defaults to False.

    Returns:
        FeatMaps: maps (B, num_layers, heads, R, h, w) and metadata.
    """
    if map_type not in MAP_TYPES:
        raise ValueError(f'map_type must be one of {MAP_TYPES}, got {map_type!r}')
    if head_reduce not in (None, 'mean'):
        raise ValueError(f"head_reduce must be None or 'mean', got {head_reduce!r}")
    layer_ids = resolve_layers(layers, backbone.num_layers)
    out = backbone.forward_layers(inputs, layers=layer_ids, with_mixing=map_type == 'mixing')
    layout, hw = out['layout'], tuple(out['hw'])
    mean_query = resolve_query(layout, query) == 'mean'
    q = query_tokens(layout, query)
    per_layer = []
    for i, tokens in enumerate(out['tokens']):
        if map_type == 'mixing':
            m = mixing_maps(out['mixing'][i], layout, hw, q, mean_query)
        else:
            m = cosine_maps(tokens, layout, hw, q, cosine_heads, mean_query)
        per_layer.append(m.float())
    maps = torch.stack(per_layer, dim=1)
    if head_reduce == 'mean':
        maps = maps.mean(dim=2, keepdim=True)
    if normalize:
        maps = minmax_normalize(maps)
    patch = torch.as_tensor(layout.patch_index, dtype=torch.long, device=inputs.device)
    tokens = [t.index_select(1, patch) for t in out['tokens']] if keep_tokens else []
    return FeatMaps(maps=maps, layers=layer_ids, query_index=[] if mean_query else q.tolist(),
                    map_type=map_type, normalized=normalize, patch_tokens=tokens)
