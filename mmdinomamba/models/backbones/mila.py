"""MILA: the hierarchical Mamba-Inspired Linear Attention backbone.

"Demystify Mamba in Vision: A Linear Attention Perspective" (Han et al., NeurIPS 2024,
https://arxiv.org/abs/2405.16605; code LeapLabTHU/MLLA). Four stages of widths ``C, 2C, 4C, 8C``
at strides 4, 8, 16, 32. Each block is ``CPE -> Mamba-style gated linear attention (in_proj ->
dw 3x3 conv -> SiLU -> ELU+1 linear attention with RoPE and LePE, v = x, times SiLU(act_proj) ->
out_proj) -> CPE -> MLP``; the stem is convolutional (stride 4) and downsampling MBConv-like.
Every part is a switch (``mixer_cfg``, ``cpe``, ``ape``, ``stem``, ``downsample``), so the
paper's ablations (Swin-T geometry, ViT blocks, Mamba's designs, positional encodings) are configs.

Outputs (mmpretrain style, a tuple over ``out_indices`` = stages), each after that stage's
LayerNorm (``norm{i}``): ``'featmap'`` (B, C_i, H_i, W_i) for UperNet / Mask R-CNN,
``'avg_featmap'`` (B, C_i) (LN -> average pool, MILA's classifier input) or ``'raw'``
(B, H_i * W_i, C_i). There is no cls token.
"""
import torch
from mmpretrain.models.backbones.base_backbone import BaseBackbone
from mmpretrain.registry import MODELS
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..utils import resize_pos_embed
from .contract import BackboneContract, resolve_indices, resolve_layer_indices
from .layout import TokenLayout
from .mila_layers import ConvStem, LinearMerging, MBConvMerging, MILABlock, PatchStem

__all__ = ['MILA']

MILA_MIXER = dict(type='MambaLikeLinearAttention', block_design='mamba', kernel='elu', rope=True,
                  lepe=True, qkv_bias=True)


@MODELS.register_module()
class MILA(BackboneContract, BaseBackbone):
    """Hierarchical MILA backbone (see the module docstring).

    On the same contract as the plain backbones (``docs/CONTRACTS.md``): arch parsing, argument
    checks, freezing and the strict ``Pretrained`` init are shared
    (:class:`~.contract.BackboneContract`); ``out_indices`` and ``frozen_stages`` count stages.

    Args:
        arch (str | dict): 't', 's', 'b' (or 'tiny', 'small', 'base'), or a dict with
            ``embed_dims``, ``depths``, ``num_heads`` (and optionally ``drop_path_rate``).
            Defaults to 't'.
        img_size (int | tuple): training size; sets the APE grid. Defaults to 224.
        patch_size (int): stem stride; must be 4. Defaults to 4.
        in_channels (int): image channels. Defaults to 3.
        out_indices (int | Sequence[int]): stages to output (negative allowed). Defaults to (3,).
        out_type (str): 'featmap', 'avg_featmap' or 'raw'. Defaults to 'avg_featmap'.
        drop_path_rate (float, optional): stochastic depth (linear over all blocks). Defaults to
            the arch value (0.2 / 0.3 / 0.5).
        final_norm (bool): LayerNorm each output stage. Defaults to True.
        frozen_stages (int): freeze the stem and the first ``k`` stages; -1 none. Defaults to -1.
        norm_eval (bool): keep BatchNorm in eval mode while training. Defaults to False.
        with_cp (bool): activation checkpointing per block. Defaults to False.
        mlp_ratio (float): MLP ratio. Defaults to 4.
        ape (bool): learnable absolute position embedding after the stem. Defaults to False.
        cpe (bool): conditional position encoding in every block. Defaults to True.
        stem (str): 'conv' (MILA) or 'patch' (Swin 4x4). Defaults to 'conv'.
        downsample (str): 'mbconv' (MILA) or 'linear' (Swin merge). Defaults to 'mbconv'.
        mixer_cfg (dict, optional): overrides of the mixer config :data:`MILA_MIXER`
            (``num_heads`` comes from the arch). Defaults to None.
        init_cfg (dict, optional): mmengine init config; ``Pretrained`` loads strictly (see
            :meth:`init_weights`). Defaults to None.
    """
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=64, depths=[2, 4, 8, 4],
                                            num_heads=[2, 4, 8, 16], drop_path_rate=0.2)),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=64, depths=[3, 6, 21, 6],
                                             num_heads=[2, 4, 8, 16], drop_path_rate=0.3)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=96, depths=[3, 6, 21, 6],
                                            num_heads=[3, 6, 12, 24], drop_path_rate=0.5)),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    arch_defaults = dict(drop_path_rate=0.)
    OUT_TYPES = ('featmap', 'avg_featmap', 'raw')
    out_type_note = ' (MILA has no cls token)'

    def __init__(self, arch='t', img_size=224, patch_size=4, in_channels=3, out_indices=(3, ),
                 out_type='avg_featmap', drop_path_rate=None, final_norm=True, frozen_stages=-1,
                 norm_eval=False, with_cp=False, mlp_ratio=4., ape=False, cpe=True, stem='conv',
                 downsample='mbconv', mixer_cfg=None, init_cfg=None):
        super().__init__(init_cfg)
        arch = self._parse_arch(arch)
        depths, heads = list(arch['depths']), list(arch['num_heads'])
        self.embed_dims, self.num_stages = arch['embed_dims'], len(depths)
        self.stage_dims = [self.embed_dims * 2**i for i in range(self.num_stages)]
        self.num_layers, self.patch_size = sum(depths), patch_size
        if patch_size != 4:
            raise ValueError(f'MILA: patch_size must be 4 (stride-4 stem), got {patch_size}')
        self.out_type = self._check_out_type(out_type)
        self.with_cp, self.norm_eval = with_cp, norm_eval
        self.out_indices = resolve_indices(out_indices, self.num_stages, 'out_indices', 'stage')
        self.frozen_stages = self._check_frozen_stages(frozen_stages, self.num_stages)
        self._build_stem(stem, in_channels, ape, img_size)
        rate = arch['drop_path_rate'] if drop_path_rate is None else drop_path_rate
        dpr = [rate * i / max(self.num_layers - 1, 1) for i in range(self.num_layers)]
        mixer = dict(MILA_MIXER, **(mixer_cfg or {}))
        self.stage_of = [s for s, d in enumerate(depths) for _ in range(d)]
        self.layers = nn.ModuleList(
            MILABlock(self.stage_dims[s], dict(mixer, num_heads=heads[s]), mlp_ratio, dpr[i], cpe)
            for i, s in enumerate(self.stage_of))
        if downsample not in ('mbconv', 'linear'):
            raise ValueError(f"MILA: downsample must be 'mbconv' or 'linear', got {downsample!r}")
        merge = MBConvMerging if downsample == 'mbconv' else LinearMerging
        self.downsamples = nn.ModuleList(
            merge(self.stage_dims[s], self.stage_dims[s + 1]) for s in range(self.num_stages - 1))
        for s in self.out_indices:
            self.add_module(f'norm{s}', nn.LayerNorm(self.stage_dims[s]) if final_norm
                            else nn.Identity())
        self._freeze_stages()

    @classmethod
    def _check_arch(cls, arch: dict) -> None:
        if len(arch['depths']) != len(arch['num_heads']):
            raise ValueError('MILA: arch depths and num_heads must have the same length, got '
                             f"{arch['depths']} and {arch['num_heads']}")

    def _build_stem(self, stem: str, in_channels: int, ape: bool, img_size) -> None:
        if stem not in ('conv', 'patch'):
            raise ValueError(f"MILA: stem must be 'conv' or 'patch', got {stem!r}")
        c = self.embed_dims
        self.patch_embed = ConvStem(in_channels, c) if stem == 'conv' else PatchStem(in_channels, c)
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.pos_grid = (-(-size[0] // 4), -(-size[1] // 4))
        self.absolute_pos_embed = None
        if ape:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] *
                                                               self.pos_grid[1], c))

    #: the LayerNorms of output stages a checkpoint may lack (a classifier has ``norm3`` only;
    #: seg / det models output every stage): they keep their init (weight 1, bias 0)
    optional_pretrained_keys = (r'^norm\d+\.(weight|bias)$', )

    def _init_from_scratch(self):
        """MILA's init: truncated normal Linear, unit LayerNorm (after mmengine's init)."""
        already = self._is_init
        super()._init_from_scratch()  # warns and does nothing when called a second time
        if already:
            return
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.absolute_pos_embed is not None:
            nn.init.trunc_normal_(self.absolute_pos_embed, std=.02)

    def _stage_modules(self, s: int) -> list:
        mods = [blk for blk, st in zip(self.layers, self.stage_of) if st == s]
        if s < self.num_stages - 1:
            mods.append(self.downsamples[s])
        return mods + ([getattr(self, f'norm{s}')] if s in self.out_indices else [])

    def _frozen_parts(self) -> tuple[list, list]:
        """``frozen_stages = k >= 0``: the stem, the first ``k`` stages (blocks, downsampling,
        output norm) and the absolute position embedding."""
        if self.frozen_stages < 0:
            return [], []
        modules = [self.patch_embed]
        for s in range(self.frozen_stages):
            modules += self._stage_modules(s)
        params = [] if self.absolute_pos_embed is None else [self.absolute_pos_embed]
        return modules, params

    def _embed(self, x: Tensor):
        x, hw = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = x + resize_pos_embed(self.absolute_pos_embed, self.pos_grid, hw)
        return x, hw

    def _run_block(self, i: int, x: Tensor, hw) -> Tensor:
        if self.with_cp and self.training and x.requires_grad:
            return checkpoint(self.layers[i], x, hw, use_reentrant=False)
        return self.layers[i](x, hw)

    def _output(self, s: int, x: Tensor, hw) -> Tensor:
        x = getattr(self, f'norm{s}')(x)
        if self.out_type == 'raw':
            return x
        if self.out_type == 'avg_featmap':
            return x.mean(dim=1)
        return x.transpose(1, 2).reshape(x.shape[0], -1, *hw).contiguous()

    def forward(self, x: Tensor) -> tuple:
        """x: (B, 3, H, W) -> tuple of the ``out_indices`` stage outputs (see ``out_type``)."""
        x, hw = self._embed(x)
        outs = {}
        for i in range(self.num_layers):
            x = self._run_block(i, x, hw)
            s = self.stage_of[i]
            if i + 1 == self.num_layers or self.stage_of[i + 1] != s:
                if s in self.out_indices:
                    outs[s] = self._output(s, x, hw)
                if s < self.num_stages - 1:
                    x, hw = self.downsamples[s](x, hw)
        return tuple(outs[s] for s in self.out_indices)

    def token_layout(self, hw) -> TokenLayout:
        """Patch tokens only: ``cls_index=None``, no registers, raster order."""
        n = int(hw[0]) * int(hw[1])
        return TokenLayout(n, None, patch_index=torch.arange(n))

    def _stage_norm(self, s: int):
        return getattr(self, f'norm{s}') if s in self.out_indices else nn.Identity()

    @property
    def layer_dims(self) -> list:
        """Width of each block's tokens (``C * 2**stage``)."""
        return [self.stage_dims[s] for s in self.stage_of]

    def _stage_range(self, s: int) -> str:
        blocks = [i for i, st in enumerate(self.stage_of) if st == s]
        return f'{blocks[0]}..{blocks[-1]}'

    def _run_layers(self, x: Tensor, wanted: list, with_mixing: bool, source: str) -> dict:
        """Run the blocks up to ``max(wanted)``; per wanted block its normed tokens, grid and
        (if asked) mixing matrix."""
        if source not in ('block', 'mixer'):
            raise ValueError(f"MILA: source={source!r} is not 'block' or 'mixer'")
        x, hw = self._embed(x)
        got = {}
        for i in range(max(wanted) + 1):
            s, block = self.stage_of[i], self.layers[i]
            if i in wanted and with_mixing:
                got.setdefault(i, {})['mixing'] = block.mixer.mixing_matrix(
                    block.mixer_input(x, hw), hw)
            x, y = block.forward_with_mixer(x, hw)
            if i in wanted:
                got.setdefault(i, {}).update(
                    tokens=self._stage_norm(s)(y if source == 'mixer' else x), hw=tuple(hw))
            if s < self.num_stages - 1 and (i + 1 == self.num_layers or self.stage_of[i + 1] != s):
                x, hw = self.downsamples[s](x, hw)
        return got

    def forward_layers(self, x: Tensor, layers=None, with_mixing: bool = False,
                       source: str = 'block') -> dict:
        """Per-block outputs for analysis and probing (blocks 0..num_layers-1 across stages).

        The backbone contract of ``docs/CONTRACTS.md``: one patch grid and one layout, so the
        requested blocks must lie in ONE stage (their grids and widths differ across stages).
        Tokens are normed with the stage's output norm when that stage is in ``out_indices``
        (else returned as they are). ``mixing`` holds ``block.mixer.mixing_matrix(
        block.mixer_input(x), hw)`` (``mixer_input`` = ``norm1(cpe1(x))``). MILA has no cls
        token and no registers (``layout.cls_index is None``): feature maps use the mean over
        the patch queries (``compute_featmaps(query='mean')``), a probe pools the patches.

        Args:
            x (Tensor): (B, in_channels, H, W) images.
            layers (int | Sequence[int], optional): 0-based blocks (negative allowed), in the
                order wanted. Defaults to all blocks (an error when there are several stages).
            with_mixing (bool): also return each requested block's mixing matrix.
            source (str): 'block' (the block output) or 'mixer' (the mixer output), normed as
                above. Defaults to 'block'.

        Returns:
            dict: ``tokens`` list of (B, L, C_s); ``hw`` the grid (h, w) of the stage;
            ``layout`` its :class:`TokenLayout`; ``mixing`` list of (B, heads_s, L, L) (if asked).

        Raises:
            IndexError: a block index out of ``[-num_layers, num_layers)`` (checked before any
                index is wrapped).
            ValueError: the requested blocks span several stages.
        """
        wanted = resolve_layer_indices(range(self.num_layers) if layers is None else layers,
                                       self.num_layers, 'layers')
        stages = sorted({self.stage_of[i] for i in wanted})
        if len(stages) > 1:
            ranges = ', '.join(f'stage {s}: blocks {self._stage_range(s)}' for s in stages)
            raise ValueError(f'MILA.forward_layers returns one grid and layout, but the blocks '
                             f'{wanted} lie in the stages {stages} (grids and widths differ); '
                             f'request the blocks of one stage at a time ({ranges})')
        got = self._run_layers(x, wanted, with_mixing, source)
        hw = got[wanted[0]]['hw']
        out = dict(tokens=[got[i]['tokens'] for i in wanted], hw=hw, layout=self.token_layout(hw))
        if with_mixing:
            out['mixing'] = [got[i]['mixing'] for i in wanted]
        return out

    def get_intermediate_layers(self, x: Tensor, n: int = 1, source: str = 'block') -> list:
        """Mean-pooled (stage-normed) tokens of the last ``n`` blocks: list of (B, C_i) (the
        blocks may span stages)."""
        if not 1 <= n <= self.num_layers:
            raise ValueError(f'n={n} must be in [1, {self.num_layers}]')
        wanted = list(range(self.num_layers - n, self.num_layers))
        got = self._run_layers(x, wanted, False, source)
        return [got[i]['tokens'].mean(dim=1) for i in wanted]
