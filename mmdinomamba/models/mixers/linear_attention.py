"""Multi-head (non-causal) linear attention as a token mixer ``Y = M X`` (the paper's LinearViT)."""
from mmpretrain.registry import MODELS
from torch import Tensor, nn

__all__ = ['LinearAttention']

KERNELS = ('softmax', 'elu')


@MODELS.register_module()
class LinearAttention(nn.Module):
    """Linear attention ``M = psi(Q) psi(K)^T`` computed in ``O(L d^2)``.

    The paper's LinearViT replaces ``softmax(Q K^T)`` by ``psi(Q) psi(K)^T``. Per head, with
    ``Q, K, V`` of shape (L, d):

    * ``kernel='softmax'`` (default; Efficient-Attention style, Shen et al. 2021):
      ``psi(Q)[i, :] = softmax_f(Q[i, :])`` (each query row normalized over the d features) and
      ``psi(K)[:, f] = softmax_j(K[:, f])`` (each key feature normalized over the L tokens).
      Then ``M = psi(Q) psi(K)^T`` has non-negative rows summing to one
      (``sum_j M_ij = sum_f psi(Q)_if sum_j psi(K)_jf = 1``), no further normalization.
    * ``kernel='elu'`` (Katharopoulos et al. 2020): ``psi = ELU + 1`` elementwise and
      ``M_ij = psi(q_i) . psi(k_j) / (psi(q_i) . sum_j psi(k_j) + eps)`` (rows sum to ~1).

    ``forward`` computes ``psi(Q) (psi(K)^T V)`` (a (d, d) state per head, never the (L, L)
    matrix); ``mixing_matrix`` returns ``M`` exactly as normalized by ``forward``, so
    ``mixing_matrix(x) @ V`` equals the mixing step. Heads are concatenated and projected by
    ``proj``. No ``1/sqrt(d)`` scale is applied. Rank of ``M`` is at most ``d`` per head.

    Args:
        embed_dims (int): token width ``C``.
        num_heads (int): number of heads; must divide ``embed_dims``.
        kernel (str): ``'softmax'`` or ``'elu'``. Defaults to ``'softmax'``.
        qkv_bias (bool): bias in the ``qkv`` projection. Defaults to True.
        eps (float): denominator guard of the ``'elu'`` normalization. Defaults to 1e-6.
        proj_drop (float): dropout after ``proj``. Defaults to 0.
    """

    def __init__(self, embed_dims: int, num_heads: int, kernel: str = 'softmax',
                 qkv_bias: bool = True, eps: float = 1e-6, proj_drop: float = 0.):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        if kernel not in KERNELS:
            raise ValueError(f'kernel={kernel!r} is not one of {KERNELS}')
        self.embed_dims, self.num_heads, self.kernel, self.eps = embed_dims, num_heads, kernel, eps
        self.head_dims = embed_dims // num_heads
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def _features(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, L, C) -> psi(Q), psi(K), V each (B, heads, L, d)."""
        B, L, _ = x.shape
        qkv = self.qkv(x).reshape(B, L, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.kernel == 'softmax':
            return q.softmax(dim=-1), k.softmax(dim=-2), v
        return nn.functional.elu(q) + 1., nn.functional.elu(k) + 1., v

    def _row_norm(self, q: Tensor, k: Tensor) -> Tensor | None:
        """The (B, heads, L, 1) row normalizer of the 'elu' kernel; None for 'softmax'."""
        if self.kernel == 'softmax':
            return None
        return q @ k.sum(dim=-2).unsqueeze(-1) + self.eps

    def forward(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """x: (B, L, C) -> (B, L, C). ``hw`` is unused."""
        q, k, v = self._features(x)
        y = q @ (k.transpose(-2, -1) @ v)  # (B, heads, L, d) in O(L d^2)
        norm = self._row_norm(q, k)
        if norm is not None:
            y = y / norm
        B, _, L, _ = y.shape
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, L, self.embed_dims)))

    def mixing_matrix(self, x: Tensor, hw: tuple[int, int] | None = None) -> Tensor:
        """``M = psi(Q) psi(K)^T`` normalized as in ``forward``.

        Args:
            x (Tensor): (B, L, C) the mixer input (already normalized by the block).
            hw: unused.

        Returns:
            Tensor: (B, heads, L, L); ``M @ v`` is the mixing step of ``forward``.
        """
        q, k, _ = self._features(x)
        m = q @ k.transpose(-2, -1)
        norm = self._row_norm(q, k)
        return m if norm is None else m / norm
