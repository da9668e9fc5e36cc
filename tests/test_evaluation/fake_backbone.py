"""A tiny backbone that implements the backbone contract (docs/CONTRACTS.md) for tests.

Softmax-attention blocks ``x + mixer(norm1(x))``, a final LayerNorm, a cls token at the front, in
the middle or absent, and optional evenly spread register tokens.
"""
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Layout:
    length: int
    cls_index: object
    register_index: torch.Tensor
    patch_index: torch.Tensor


class Attn(nn.Module):

    def __init__(self, dim, heads):
        super().__init__()
        self.num_heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def split(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        return qkv.permute(2, 0, 3, 1, 4)  # 3, B, heads, L, d

    def mixing_matrix(self, x, hw=None):
        q, k, _ = self.split(x)
        return (q @ k.transpose(-1, -2) * q.shape[-1]**-0.5).softmax(-1)

    def forward(self, x, hw=None):
        b, n, c = x.shape
        v = self.split(x)[2]
        y = (self.mixing_matrix(x) @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(y)


class Block(nn.Module):

    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mixer = Attn(dim, heads)

    def forward(self, x, hw=None):
        return x + self.mixer(self.norm1(x), hw)


class FakeBackbone(nn.Module):
    """Contract-conforming toy backbone (cls: 'front', 'middle' or None)."""

    def __init__(self, embed_dims=16, num_heads=2, num_layers=2, patch_size=8, cls='front',
                 num_registers=0):
        super().__init__()
        self.embed_dims, self.num_layers, self.patch_size = embed_dims, num_layers, patch_size
        self.cls, self.num_registers = cls, num_registers
        self.patch_embed = nn.Conv2d(3, embed_dims, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dims))
        self.registers = nn.Parameter(torch.randn(1, max(num_registers, 1), embed_dims))
        self.layers = nn.ModuleList(Block(embed_dims, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(embed_dims)

    def token_layout(self, hw):
        n = hw[0] * hw[1]
        kinds = ['p'] * n
        if self.num_registers:
            step = n // (self.num_registers + 1)
            for r in range(self.num_registers):
                kinds.insert((r + 1) * step + r, 'r')
        if self.cls == 'front':
            kinds.insert(0, 'c')
        elif self.cls == 'middle':
            kinds.insert(len(kinds) // 2, 'c')

        def idx(kind):
            return torch.tensor([i for i, t in enumerate(kinds) if t == kind], dtype=torch.long)

        cls_index = kinds.index('c') if 'c' in kinds else None
        return Layout(len(kinds), cls_index, idx('r'), idx('p'))

    def forward_layers(self, x, layers=None, with_mixing=False):
        p = self.patch_embed(x)
        hw = tuple(p.shape[-2:])
        layout = self.token_layout(hw)
        b = x.shape[0]
        seq = x.new_zeros(b, layout.length, self.embed_dims)
        seq[:, layout.patch_index] = p.flatten(2).transpose(1, 2)
        if layout.cls_index is not None:
            seq[:, layout.cls_index] = self.cls_token[:, 0]
        if self.num_registers:
            seq[:, layout.register_index] = self.registers.expand(b, -1, -1)
        wanted = list(range(self.num_layers)) if layers is None else list(layers)
        tokens, mixing = {}, {}
        for i, layer in enumerate(self.layers):
            if with_mixing and i in wanted:
                mixing[i] = layer.mixer.mixing_matrix(layer.norm1(seq), hw)
            seq = layer(seq, hw)
            tokens[i] = self.norm(seq)
        out = dict(tokens=[tokens[i] for i in wanted], hw=hw, layout=layout)
        if with_mixing:
            out['mixing'] = [mixing[i] for i in wanted]
        return out


def register_fake_backbone():
    """Register FakeBackbone in mmpretrain's MODELS (idempotent)."""
    from mmpretrain.registry import MODELS
    MODELS.register_module(name='FakeBackbone', module=FakeBackbone, force=True)
    return FakeBackbone
