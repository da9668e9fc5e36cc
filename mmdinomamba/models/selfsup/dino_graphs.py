"""CUDA graphs for DINO's backbone calls: one graph per crop shape.

A DINO step calls the backbone three times per iteration with fixed shapes (``drop_last``
keeps the batch fixed): the teacher on the global crops (no gradient) and the student on the
global and on the local crops (forward and backward). Launching the kernels of one such call
costs the host about as much as the GPU needs to run them, whatever the crop size; a replayed
CUDA graph launches them all at once.

:class:`CropGraphs` runs those calls

1. eagerly for ``warmup_iters`` training iterations (first-call work is done there: Triton
   autotuning and the kernels' self-checks, which read values to the host, the token layout
   caches);
2. then captures one graph per crop shape, after a few more calls on a side stream: the
   teacher's forward with ``torch.cuda.graph``, the student's forward and backward with
   ``torch.cuda.make_graphed_callables`` (a thin module around the backbone per shape, so the
   backbone's own ``forward`` is left alone), inside ``torch.autocast`` with the step's dtype
   and ``cache_enabled=False``;
3. afterwards copies each call's input into that shape's static buffer and replays.

Only the backbones are captured. The head (with DINO's frozen last layer: the detached
weight), the loss, the center, the clipping, the optimizer and the EMA run eagerly as before,
and the schedules reach them as device scalars, so they need no re-capture when they change.
A crop shape seen for the first time after the capture runs eagerly. With ``capture=False``
the same static-buffer path runs without graphs (eagerly, on any device): what the tests on CPU
check against the plain path.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ['CropGraphs']

Key = Tuple[str, tuple, torch.dtype]


class _Feature(nn.Module):
    """``backbone(x)[-1]`` as a module of its own (one per captured shape)."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone(x)[-1]


class CropGraphs:
    """Warm-up, capture and replay of the backbone calls of a DINO step, per crop shape.

    Args:
        warmup_iters (int): training iterations run eagerly before the capture. Defaults to 3.
        side_stream_iters (int): calls on a side stream right before each capture (as
            ``torch.cuda.graph`` recommends). Defaults to 2.
        capture (bool): capture CUDA graphs (needs CUDA tensors); False runs the static
            buffers eagerly. Defaults to True.
    """

    def __init__(self, warmup_iters: int = 3, side_stream_iters: int = 2, capture: bool = True):
        if warmup_iters < 1 or side_stream_iters < 1:
            raise ValueError(f'CropGraphs: warmup_iters ({warmup_iters}) and side_stream_iters '
                             f'({side_stream_iters}) must be >= 1')
        self.warmup_iters, self.side_stream_iters = warmup_iters, side_stream_iters
        self.capture = capture
        self.iterations = 0
        self.static_inputs: Dict[Key, Tensor] = {}
        self._teacher: Dict[Key, tuple] = {}
        self._student: Dict[Key, Callable] = {}
        self._autocast: Optional[tuple] = None

    @property
    def ready(self) -> bool:
        """Whether the warm-up is over (graphs are captured / static buffers in use)."""
        return self.iterations > self.warmup_iters

    def start_iteration(self) -> None:
        """Count one training iteration (called by the model at the start of its loss)."""
        self.iterations += 1

    def keys(self) -> list:
        """The (role, shape, dtype) of every call that has its static buffer."""
        return sorted(self.static_inputs, key=str)

    # ---- calls ---------------------------------------------------------------------------
    def teacher(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """The teacher backbone's feature of ``x`` (no gradient)."""
        if not self.ready:
            return backbone(x)[-1]
        key = ('teacher', tuple(x.shape), x.dtype)
        if key not in self.static_inputs:
            self._new_teacher(key, backbone, x)
        self.static_inputs[key].copy_(x)
        if not self.capture:
            return backbone(self.static_inputs[key])[-1]
        self._check_autocast()
        graph, out = self._teacher[key]
        graph.replay()
        return out

    def student(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """The student backbone's feature of ``x`` (with gradient)."""
        if not self.ready:
            return backbone(x)[-1]
        key = ('student', tuple(x.shape), x.dtype)
        if key not in self.static_inputs:
            self._new_student(key, backbone, x)
        static = self.static_inputs[key]
        static.copy_(x)
        if not self.capture:
            return backbone(static)[-1]
        self._check_autocast()
        return self._student[key](static)

    # ---- capture -------------------------------------------------------------------------
    def _autocast_state(self) -> tuple:
        return (torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda'))

    def _check_autocast(self) -> None:
        if self._autocast != self._autocast_state():
            raise RuntimeError(f'DINO cuda_graphs: the graphs were captured under autocast '
                               f'(enabled, dtype) = {self._autocast}, this step runs under '
                               f'{self._autocast_state()}; keep the optimizer wrapper\'s dtype '
                               'fixed during training')

    def _cuda_check(self, x: Tensor) -> None:
        if not x.is_cuda:
            raise RuntimeError(f'DINO cuda_graphs=True needs CUDA inputs, got a {x.device} '
                               'tensor; train on a GPU or set model.cuda_graphs=False')
        if self._autocast is None:
            self._autocast = self._autocast_state()

    def _autocast_ctx(self):
        enabled, dtype = self._autocast
        return torch.autocast('cuda', dtype=dtype, enabled=enabled, cache_enabled=False)

    def _side_stream(self, fn: Callable) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), self._autocast_ctx():
            for _ in range(self.side_stream_iters):
                fn()
        torch.cuda.current_stream().wait_stream(stream)

    def _new_teacher(self, key: Key, backbone: nn.Module, x: Tensor) -> None:
        static = x.detach().clone()
        self.static_inputs[key] = static
        if not self.capture:
            return
        self._cuda_check(x)
        with torch.no_grad():
            self._side_stream(lambda: backbone(static))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), self._autocast_ctx():
                out = backbone(static)[-1]
        self._teacher[key] = (graph, out)

    def _new_student(self, key: Key, backbone: nn.Module, x: Tensor) -> None:
        static = x.detach().clone()
        self.static_inputs[key] = static
        if not self.capture:
            return
        self._cuda_check(x)
        feature = _Feature(backbone)
        with self._autocast_ctx():
            self._student[key] = torch.cuda.make_graphed_callables(
                feature, (static,), num_warmup_iters=self.side_stream_iters,
                allow_unused_input=True)
