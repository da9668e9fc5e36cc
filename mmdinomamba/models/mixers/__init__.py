"""Token mixers ``Y = M X``: softmax attention, linear attention, bidirectional SSD, MILA."""
from .attention import SoftmaxAttention
from .bissd import BiSSD
from .linear_attention import LinearAttention
from .mila import MambaLikeLinearAttention

__all__ = ['SoftmaxAttention', 'LinearAttention', 'BiSSD', 'MambaLikeLinearAttention']
