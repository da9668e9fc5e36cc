"""Position-embedding resizing shared by every plain backbone."""
import math

import torch.nn.functional as F
from torch import Tensor

__all__ = ['resize_pos_embed', 'infer_grid']


def infer_grid(num_tokens: int) -> tuple[int, int]:
    """Return the square grid ``(s, s)`` with ``s * s == num_tokens``.

    Raises:
        ValueError: if ``num_tokens`` is not a perfect square.
    """
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f'cannot infer a square grid from {num_tokens} position embeddings; '
                         'pass the grid explicitly')
    return side, side


def resize_pos_embed(pos_embed: Tensor, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> Tensor:
    """Bicubically resize a patch position-embedding grid, DINO style.

    Follows the convention of DINO's ``interpolate_pos_encoding`` (also used by Dino-Mamba's
    DinoVim and Mamba-Reg): the grid is resized with ``scale_factor = (dst + 0.1) / src`` per axis
    (the +0.1 avoids a floor rounding error, as in DINO's code), bicubic, no ``align_corners``, so a
    converted official checkpoint computes exactly what it computed in its own code. The grid is
    returned unchanged when the sizes already match.

    Args:
        pos_embed (Tensor): (1, h0 * w0, C) raster-ordered patch position embeddings.
        src_hw (tuple[int, int]): the stored grid ``(h0, w0)``.
        dst_hw (tuple[int, int]): the target grid ``(h, w)`` (any aspect ratio).

    Returns:
        Tensor: (1, h * w, C).
    """
    (h0, w0), (h, w) = tuple(src_hw), tuple(dst_hw)
    if pos_embed.shape[1] != h0 * w0:
        raise ValueError(f'pos_embed has {pos_embed.shape[1]} rows, grid {h0}x{w0} needs {h0 * w0}')
    if (h0, w0) == (h, w):
        return pos_embed
    dim = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, h0, w0, dim).permute(0, 3, 1, 2)
    dtype = grid.dtype
    grid = F.interpolate(grid.float(), scale_factor=((h + 0.1) / h0, (w + 0.1) / w0),
                         mode='bicubic', align_corners=False)
    if grid.shape[-2:] != (h, w):  # pragma: no cover - guarded by the +0.1 offset
        raise RuntimeError(f'pos-embed resize produced {tuple(grid.shape[-2:])}, wanted {(h, w)}')
    return grid.to(dtype).permute(0, 2, 3, 1).reshape(1, h * w, dim)
