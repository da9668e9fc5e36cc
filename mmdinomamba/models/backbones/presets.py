"""Named backbone presets of the tools (``vit-s``, ``dinovim-b``, ``mila-t``, ...).

A preset is the registered backbone type with one of its ``arch_zoo`` sizes, e.g.
``'dinovim-b' -> dict(type='DinoVim', arch='b')``; ``tools/analysis/benchmark.py`` and
``tools/analysis/rank_analysis.py`` accept these names.
"""
__all__ = ['BACKBONE_PRESETS']

_FAMILIES = (('vit', 'ViT', 'sb'), ('linearvit', 'LinearViT', 'sb'), ('dinovim', 'DinoVim', 'tsb'),
             ('mambareg', 'MambaReg', 'tsb'), ('mila', 'MILA', 'tsb'))

#: preset name -> backbone config (``type`` and ``arch``)
BACKBONE_PRESETS = {f'{name}-{size}': dict(type=type_, arch=size)
                    for name, type_, sizes in _FAMILIES for size in sizes}
