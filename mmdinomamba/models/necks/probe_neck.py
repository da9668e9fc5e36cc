"""Linear-probe features: pool each of the last ``n`` blocks' token sequences and concatenate.

DINO's ``eval_linear`` (Caron et al., 2021) concatenates the final-normed cls token of the last
``n`` blocks (optionally plus the average of the last block's patch tokens); Dino-Mamba's
``eval_linear_vim`` does the same with the middle cls token (``eval_linear_mambar``: the mean of
the 12 register tokens). The paper's Table 6 compares five ways to pool one block (middle cls,
mean, max, middle cls + mean, middle cls + max). This neck implements all of them on the token
sequences of :meth:`PlainBackbone.forward_layers` and the backbone's :class:`TokenLayout`.
"""
from typing import Sequence

import torch
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['ProbeFeatureNeck', 'pool_tokens', 'POOLINGS']

#: pooling name -> the parts concatenated for one block (in this order)
POOLINGS = {
    'cls': ('cls', ),
    'mean': ('mean', ),
    'max': ('max', ),
    'cls+mean': ('cls', 'mean'),
    'cls+max': ('cls', 'max'),
    'registers': ('registers', ),
}


def _index(index: Tensor, tokens: Tensor) -> Tensor:
    return index.to(device=tokens.device, dtype=torch.long)


def _part(tokens: Tensor, layout, part: str) -> Tensor:
    """One pooled part of ``tokens`` (B, L, C) -> (B, C) (``registers``: (B, R*C))."""
    regs = layout.register_index
    if part == 'cls':
        if layout.cls_index is not None:
            return tokens[:, layout.cls_index]
        if regs.numel():
            return tokens[:, _index(regs, tokens)].mean(dim=1)
        raise ValueError("pooling 'cls': the token layout has neither a cls token nor registers")
    if part == 'registers':
        if not regs.numel():
            raise ValueError("pooling 'registers' needs a backbone with register tokens "
                             '(MambaReg); this layout has none')
        return tokens[:, _index(regs, tokens)].flatten(1)
    patches = tokens[:, _index(layout.patch_index, tokens)]
    return patches.mean(dim=1) if part == 'mean' else patches.amax(dim=1)


def pool_tokens(tokens: Tensor, layout, pooling: str = 'cls') -> Tensor:
    """Pool one block's final-normed token sequence.

    Args:
        tokens (Tensor): (B, L, C) tokens of one block.
        layout (TokenLayout): where the cls token, registers and patches are.
        pooling (str): a key of :data:`POOLINGS`:

            * ``'cls'``: the cls token (middle cls for DinoVim, first for ViT); for a layout
              without cls but with registers (MambaReg) the MEAN of the register tokens, which
              is Dino-Mamba's ``eval_linear_mambar`` recipe (the one behind Table 1's 78.5).
            * ``'mean'`` / ``'max'``: mean / element-wise max over the PATCH tokens (the cls
              token and registers excluded). Vim's ``final_pool_type='mean'`` averages all
              tokens incl. the cls (1 of 197, a negligible difference); Vim's ``'max'`` takes
              the max over per-token logits, which is not a feature pooling and is not used.
            * ``'cls+mean'`` / ``'cls+max'``: the two concatenated (2C).
            * ``'registers'``: the R register tokens concatenated (R*C), the input of
              Mamba-Reg's own classification head (wangf3014/Mamba-Reg), without its learned
              per-register ``Linear(C, C/r)`` reduction and RMSNorm (a linear map before a
              linear probe adds nothing).

    Returns:
        Tensor: (B, k*C) with k = number of parts (R for ``'registers'``).
    """
    if pooling not in POOLINGS:
        raise ValueError(f'pooling={pooling!r} is not one of {sorted(POOLINGS)}')
    return torch.cat([_part(tokens, layout, p) for p in POOLINGS[pooling]], dim=1)


@MODELS.register_module()
class ProbeFeatureNeck(nn.Module):
    """Concatenate the pooled features of several blocks (+ optional patch-token average).

    ``forward(tokens, layout)`` with ``tokens`` the (B, L, C) sequences of the last ``n`` blocks
    (oldest first, each after the backbone's final norm) returns a 1-tuple with the (B, D)
    feature ``cat([pool(t_1), ..., pool(t_n)] + [mean of t_n's patch tokens if avgpool])``, so
    ``D = n * k * C (+ C)``; see :meth:`out_channels`.

    Args:
        pooling (str): per-block pooling, see :func:`pool_tokens`. Defaults to 'cls'.
        avgpool (bool): append the average of the LAST block's patch tokens (DINO's
            ``--avgpool_patchtokens``, used for ViT-B). Defaults to False.
    """

    def __init__(self, pooling: str = 'cls', avgpool: bool = False):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f'ProbeFeatureNeck: pooling={pooling!r} is not one of '
                             f'{sorted(POOLINGS)}')
        self.pooling, self.avgpool = pooling, avgpool

    def out_channels(self, embed_dims: int, num_blocks: int, num_registers: int = 0) -> int:
        """Feature size ``D`` for ``num_blocks`` blocks of width ``embed_dims``."""
        parts = POOLINGS[self.pooling]
        per_block = sum(num_registers if p == 'registers' else 1 for p in parts)
        return embed_dims * (num_blocks * per_block + int(self.avgpool))

    def forward(self, tokens: Sequence[Tensor], layout) -> tuple:
        """tokens: n x (B, L, C) -> ((B, D),)."""
        if not len(tokens):
            raise ValueError('ProbeFeatureNeck got no block outputs')
        feats = [pool_tokens(t, layout, self.pooling) for t in tokens]
        if self.avgpool:
            feats.append(_part(tokens[-1], layout, 'mean'))
        return (torch.cat(feats, dim=1), )
