"""What every backbone shares, plain (:class:`PlainBackbone`) and hierarchical (:class:`MILA`).

:class:`BackboneContract` is a mixin placed before mmpretrain's ``BaseBackbone``; it holds the
parts of the backbone contract (``docs/CONTRACTS.md``, "Backbones") that do not depend on the
trunk: parsing ``arch`` (a preset name or a dict), the argument checks, freezing
(``frozen_stages``, ``norm_eval``, ``train()``) and the strict ``Pretrained`` init. A backbone
says what it is made of (``arch_zoo``, ``arch_keys``, ``arch_defaults``, ``OUT_TYPES``) and what
``frozen_stages`` freezes (:meth:`BackboneContract._frozen_parts`).
"""
from torch import nn

from ..utils import init_weights_strict

__all__ = ['BackboneContract', 'IndexOutOfRangeError', 'resolve_indices',
           'resolve_layer_indices']


class IndexOutOfRangeError(IndexError, ValueError):
    """A layer or stage index outside ``[-n, n)``: an ``IndexError`` (and, as a bad argument
    value, a ``ValueError``)."""


def resolve_indices(indices, count: int, name: str, unit: str = 'layer') -> list[int]:
    """0-based indices (negative allowed) of ``count`` layers or stages -> absolute ones, in the
    order given.

    Args:
        indices (int | Iterable[int]): the indices.
        count (int): how many there are.
        name (str): the argument, named in the error (e.g. ``'out_indices'``).
        unit (str): what is indexed, named in the error: 'layer' or 'stage'. Defaults to 'layer'.

    Raises:
        IndexOutOfRangeError: an index outside ``[-count, count)`` (checked before any modulo,
            so an out-of-range index never wraps to another layer).
    """
    if isinstance(indices, int):
        indices = [indices]
    out = []
    for i in indices:
        if not -count <= i < count:
            raise IndexOutOfRangeError(
                f'{name}: {unit} index {i} is out of range for a backbone with {count} {unit}s '
                f'(valid: {-count}..{count - 1})')
        out.append(i % count)
    return out


def resolve_layer_indices(indices, num_layers: int, name: str = 'layers') -> list[int]:
    """:func:`resolve_indices` over the layers (blocks) of a backbone."""
    return resolve_indices(indices, num_layers, name, 'layer')


class BackboneContract:
    """Mixin of every backbone: arch parsing, argument checks, freezing, strict pretrained init.

    Class attributes a backbone sets:
        arch_zoo (dict): preset name -> arch dict.
        arch_keys (tuple): keys a custom arch dict must have.
        arch_defaults (dict): optional keys of an arch dict and their defaults.
        OUT_TYPES (tuple): the accepted ``out_type`` values.
        out_type_note (str): added to the ``out_type`` error (e.g. why ``'cls_token'`` is not
            there).
    """
    arch_zoo: dict = {}
    arch_keys: tuple = ()
    arch_defaults: dict = {}
    OUT_TYPES: tuple = ()
    out_type_note: str = ''

    # ---- arguments --------------------------------------------------------------------------
    @classmethod
    def _parse_arch(cls, arch) -> dict:
        """A preset name of ``arch_zoo`` or a custom dict -> the arch dict (defaults filled in).

        Raises:
            ValueError: an unknown preset; a dict missing ``arch_keys`` or with unknown keys;
                what :meth:`_check_arch` rejects. TypeError: neither a str nor a dict.
        """
        name = cls.__name__
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise ValueError(f'{name}: arch {arch!r} is not supported; choose one of '
                                 f'{sorted(cls.arch_zoo)} or pass a dict with keys {cls.arch_keys}')
            parsed = {**cls.arch_defaults, **cls.arch_zoo[arch.lower()]}
        elif isinstance(arch, dict):
            missing = [key for key in cls.arch_keys if key not in arch]
            if missing:
                raise ValueError(f'{name}: custom arch dict is missing the key {missing[0]!r} '
                                 f'(missing the keys {missing}; required: {cls.arch_keys})')
            unknown = set(arch) - set(cls.arch_keys) - set(cls.arch_defaults)
            if unknown:
                raise ValueError(f'{name}: unknown arch keys {sorted(unknown)}; allowed: '
                                 f'{list(cls.arch_keys) + sorted(cls.arch_defaults)}')
            parsed = {**cls.arch_defaults, **arch}
        else:
            raise TypeError(f'{name}: arch must be a str or dict, got {type(arch).__name__}')
        cls._check_arch(parsed)
        return parsed

    @classmethod
    def _check_arch(cls, arch: dict) -> None:
        """Further checks of a parsed arch dict (none by default); raise ``ValueError``."""

    def _check_out_type(self, out_type: str) -> str:
        if out_type not in self.OUT_TYPES:
            raise ValueError(f'{type(self).__name__}: out_type={out_type!r} is not one of '
                             f'{self.OUT_TYPES}{self.out_type_note}')
        return out_type

    def _check_frozen_stages(self, frozen_stages: int, num_stages: int) -> int:
        if not -1 <= frozen_stages <= num_stages:
            raise ValueError(f'{type(self).__name__}: frozen_stages={frozen_stages} must be in '
                             f'[-1, {num_stages}]')
        return frozen_stages

    # ---- training state -----------------------------------------------------------------------
    def _frozen_parts(self) -> tuple[list, list]:
        """What ``frozen_stages`` freezes: (modules, parameters outside them)."""
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        """Freeze what :meth:`_frozen_parts` names: eval mode, no gradient."""
        modules, params = self._frozen_parts()
        for p in params:
            p.requires_grad = False
        for module in modules:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        """``nn.Module.train``, then the frozen parts back to eval mode (and every BatchNorm
        with ``norm_eval``)."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    # ---- weights ------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """:meth:`_init_from_scratch`; a ``Pretrained`` init_cfg is then loaded STRICTLY: a
        checkpoint that does not fit (missing, unexpected or mis-shaped keys; another token
        layout) is an error naming the file, the prefix and the keys, except the backbone's
        ``optional_pretrained_keys`` (see :func:`~mmdinomamba.models.utils.init_weights_strict`)."""
        init_weights_strict(self, self._init_from_scratch)

    def _init_from_scratch(self) -> None:
        """mmengine's init (the init_cfg entries other than ``Pretrained``)."""
        super().init_weights()

