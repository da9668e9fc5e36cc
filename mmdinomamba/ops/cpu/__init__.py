"""The native CPU kernels (``csrc/*.cpp``, one concept a file), their loader
(:mod:`.native_cpu`: built once, self-checked once, one warning naming the reason when they
cannot be used) and the Python around them: the bidirectional mixer's fused forward and
backward (:mod:`.bidir_inner`), registered as the ``mmdinomamba::bidir_ssd`` op
(:mod:`.custom_ops`), the quadratic and chunked scans."""
from . import native_cpu

__all__ = ['native_cpu']
