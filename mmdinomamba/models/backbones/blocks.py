"""The pre-norm residual block shared by every plain backbone."""
from torch import Tensor, nn

from ..utils import DropPath

__all__ = ['Block']


class Block(nn.Module):
    """``x = x + drop_path(mixer(norm1(x)))`` then, if an MLP is given,
    ``x = x + drop_path(mlp(norm2(x)))``.

    The Vim/Dino-Mamba block is written "add -> norm -> mixer" with the residual carried
    separately; in eval mode it is this same pre-norm block (the drop-path rate applied to the
    mixer output of layer ``i`` is ``linspace(0, rate, depth)[i]`` in both).

    Args:
        norm1 (nn.Module): pre-mixer norm.
        mixer (nn.Module): token mixer, ``mixer(x (B, L, C), hw) -> (B, L, C)``.
        drop_path (float): stochastic-depth rate of this block. Defaults to 0.
        norm2 (nn.Module, optional): pre-MLP norm. Defaults to None.
        mlp (nn.Module, optional): feed-forward. Defaults to None (a Mamba block has none).
    """

    def __init__(self, norm1: nn.Module, mixer: nn.Module, drop_path: float = 0.,
                 norm2: nn.Module | None = None, mlp: nn.Module | None = None):
        super().__init__()
        self.norm1 = norm1
        self.mixer = mixer
        self.drop_path = DropPath(drop_path)
        if (norm2 is None) != (mlp is None):
            raise ValueError('norm2 and mlp must be given together')
        self.norm2 = norm2
        self.mlp = mlp

    def mixer_input(self, x: Tensor) -> Tensor:
        """``norm1(x)``, computed in the norm's dtype (the residual may be kept in float32)."""
        return self.norm1(x.to(self.norm1.weight.dtype))

    def forward_with_mixer(self, x: Tensor, hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """x: (B, L, C) -> (block output (B, L, C), mixer output (B, L, C))."""
        y = self.mixer(self.mixer_input(x), hw)
        x = x + self.drop_path(y)
        if self.mlp is not None:
            x = x + self.drop_path(self.mlp(self.norm2(x.to(self.norm2.weight.dtype))))
        return x, y

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, L, C) -> (B, L, C)."""
        return self.forward_with_mixer(x, hw)[0]
