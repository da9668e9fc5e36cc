"""Small building blocks of the plain backbones: patch embedding, MLP, drop path."""
import torch
from torch import Tensor, nn

__all__ = ['DropPath', 'Mlp', 'PatchEmbed']


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch of a sample with probability ``p``.

    Kept samples are scaled by ``1 / (1 - p)``; identity in eval mode or when ``p == 0``.

    Args:
        drop_prob (float): drop probability. Defaults to 0.
    """

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep = 1. - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class Mlp(nn.Module):
    """Transformer feed-forward ``fc1 -> GELU -> fc2`` (DINO/timm parameter names).

    Args:
        embed_dims (int): input and output width ``C``.
        hidden_dims (int): hidden width.
        drop (float): dropout after each linear layer. Defaults to 0.
    """

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, C) -> (B, L, C)."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding: ``Conv2d(kernel=stride=patch_size)``.

    Inputs whose size is not a multiple of ``patch_size`` are cropped at the bottom/right by the
    convolution (the trailing pixels are ignored), as in DINO.

    Args:
        patch_size (int): patch side ``p``.
        in_channels (int): image channels.
        embed_dims (int): token width ``C``.
    """

    def __init__(self, patch_size: int, in_channels: int, embed_dims: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """x: (B, in_channels, H, W) -> tokens (B, h*w, C) in raster order, and ``(h, w)``."""
        if x.shape[-2] < self.patch_size or x.shape[-1] < self.patch_size:
            raise ValueError(f'input {tuple(x.shape[-2:])} is smaller than one '
                             f'{self.patch_size}x{self.patch_size} patch')
        x = self.proj(x)
        hw = (x.shape[-2], x.shape[-1])
        return torch.flatten(x, 2).transpose(1, 2), hw
