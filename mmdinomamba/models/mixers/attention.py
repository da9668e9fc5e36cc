"""Multi-head softmax self-attention as a token mixer ``Y = M X``."""
import torch.nn.functional as F
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['SoftmaxAttention']


@MODELS.register_module()
class SoftmaxAttention(nn.Module):
    """Standard ViT multi-head self-attention (Vaswani et al., 2017; DINO's ``Attention``).

    ``M_h = softmax(Q_h K_h^T / sqrt(d))`` per head ``h`` (``d = C / heads``), the mixing step is
    ``M_h V_h``; heads are concatenated and projected by ``proj``. Parameter names (``qkv``,
    ``proj``) are those of DINO's ViT, so official checkpoints convert by renaming the prefix.

    Args:
        embed_dims (int): token width ``C``.
        num_heads (int): number of heads; must divide ``embed_dims``.
        qkv_bias (bool): bias in the ``qkv`` projection. Defaults to True.
        attn_drop (float): dropout on the attention weights (training only). Defaults to 0.
        proj_drop (float): dropout after ``proj``. Defaults to 0.
    """

    def __init__(self, embed_dims: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.scale = self.head_dims**-0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, L, C) -> q, k, v each (B, heads, L, d)."""
        B, L, _ = x.shape
        qkv = self.qkv(x).reshape(B, L, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def _merge(self, y: Tensor) -> Tensor:
        """y: (B, heads, L, d) -> proj(concat heads) (B, L, C)."""
        B, _, L, _ = y.shape
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, L, self.embed_dims)))

    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """x: (B, L, C) -> (B, L, C). ``hw`` is unused (attention is order-free)."""
        q, k, v = self._qkv(x)
        drop = self.attn_drop if self.training else 0.
        return self._merge(F.scaled_dot_product_attention(q, k, v, dropout_p=drop))

    def mixing_matrix(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """The attention weights ``softmax(Q K^T / sqrt(d))`` (no dropout).

        Args:
            x (Tensor): (B, L, C) the mixer input (already normalized by the block).
            hw: unused.

        Returns:
            Tensor: (B, heads, L, L); rows (queries) sum to one; ``M @ v`` is the mixing step.
        """
        q, k, _ = self._qkv(x)
        return (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
