"""Token layouts: where the cls token, registers and patches sit in the mixer's sequence.

Order matters for Mamba (a scan) and not for attention. Every layout is described by a
:class:`TokenLayout`; the trunk builds its sequence as ``cat([patches, specials])[:, order]``
where ``specials`` are ``[cls] + registers + extras`` in that order.
"""
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    'TokenLayout', 'front_cls_layout', 'middle_cls_layout', 'legacy_dinomamba_layout',
    'register_layout', 'LAYOUT_METADATA_KEY', 'MIDDLE_CLS', 'LEGACY_DINOMAMBA', 'REGISTERS',
    'record_token_layout'
]

#: ``local_metadata`` entry of a state dict recording the token layout the weights were trained
#: (or converted) for: a DinoVim computes the same features only with that layout.
LAYOUT_METADATA_KEY = 'token_layout'
MIDDLE_CLS, LEGACY_DINOMAMBA, REGISTERS = 'middle_cls', 'legacy_dinomamba', 'registers'


def _empty() -> Tensor:
    return torch.zeros(0, dtype=torch.long)


@dataclass
class TokenLayout:
    """Positions of the tokens in a sequence of ``length`` tokens.

    Attributes:
        length (int): sequence length ``L``.
        cls_index (int | None): position of the (output) cls token, None if there is none.
        register_index (Tensor): (R,) long positions of register tokens (empty if none).
        patch_index (Tensor): (h*w,) long positions of the patch tokens in raster order.
        extra_index (Tensor): (E,) positions of other non-patch tokens, e.g. the duplicate
            front cls token of the legacy Dino-Mamba layout (empty if none).
    """
    length: int
    cls_index: int | None
    register_index: Tensor = field(default_factory=_empty)
    patch_index: Tensor = field(default_factory=_empty)
    extra_index: Tensor = field(default_factory=_empty)

    @property
    def special_index(self) -> Tensor:
        """(S,) positions of the non-patch tokens, ordered ``[cls] + registers + extras``."""
        cls = _empty() if self.cls_index is None else torch.tensor([self.cls_index])
        return torch.cat([cls, self.register_index, self.extra_index])

    def gather_order(self) -> Tensor:
        """(L,) index into ``cat([patches (N), specials (S)])`` giving the sequence order."""
        order = torch.empty(self.length, dtype=torch.long)
        num_patches = self.patch_index.numel()
        special = self.special_index
        order[self.patch_index] = torch.arange(num_patches)
        order[special] = torch.arange(num_patches, num_patches + special.numel())
        return order


def _patches_around(length: int, special: list[int]) -> Tensor:
    """Positions ``0..length-1`` without ``special``. The positions index as one long tensor:
    a list index holding 0-dim tensors (e.g. grid sizes from traced shapes) would be read as a
    multidimensional index (deprecated in torch)."""
    keep = torch.ones(int(length), dtype=torch.bool)
    keep[torch.tensor([int(i) for i in special], dtype=torch.long)] = False
    return keep.nonzero().flatten()


def front_cls_layout(h: int, w: int) -> TokenLayout:
    """ViT: ``[cls, p_0, ..., p_{N-1}]``, L = N + 1."""
    n = int(h) * int(w)
    return TokenLayout(n + 1, 0, patch_index=torch.arange(1, n + 1))


def middle_cls_layout(h: int, w: int) -> TokenLayout:
    """Vim-style single middle cls: ``[p_0..p_{N//2-1}, cls, p_{N//2}..]``, L = N + 1."""
    n = int(h) * int(w)
    return TokenLayout(n + 1, n // 2, patch_index=_patches_around(n + 1, [n // 2]))


def legacy_dinomamba_layout(h: int, w: int) -> TokenLayout:
    """The released Dino-Mamba DinoVim sequence, L = N + 2.

    DINO-style ``[cls, patches]`` (M = N + 1 tokens) gets the cls token inserted AGAIN at index
    ``M // 2``: position 0 is the front cls (an ``extra`` token), ``M // 2`` the output cls.
    For 14x14 patches: front cls 0, patches 1..97, cls 98, patches 99..197.
    """
    n = int(h) * int(w)
    mid = (n + 1) // 2
    return TokenLayout(n + 2, mid, patch_index=_patches_around(n + 2, [0, mid]),
                       extra_index=torch.tensor([0]))


def register_layout(h: int, w: int, num_registers: int) -> TokenLayout:
    """Mamba-Reg: registers spread evenly among the patches (official ``get_cls_idx``).

    With ``k = N // (R + 1)``: ``R`` groups of ``k`` patches each followed by one register, then
    the remaining patches. Register positions ``k, 2k + 1, ...`` (15, 31, ..., 191 for 14x14
    patches and 12 registers).
    """
    n = int(h) * int(w)
    k = n // (num_registers + 1)
    reg = torch.arange(num_registers) * (k + 1) + k
    return TokenLayout(n + num_registers, None, register_index=reg,
                       patch_index=_patches_around(n + num_registers, reg.tolist()))


def record_token_layout(state_dict, name: str, prefix: str = '') -> None:
    """Record the token layout ``name`` for the module at ``prefix`` (e.g. '' or 'backbone.')
    in ``state_dict._metadata`` (created if absent), where that module's
    ``_load_from_state_dict`` finds it."""
    if getattr(state_dict, '_metadata', None) is None:
        from collections import OrderedDict
        state_dict._metadata = OrderedDict()
    state_dict._metadata.setdefault(prefix[:-1], {})[LAYOUT_METADATA_KEY] = name
