"""The one plain trunk behind every registered backbone (ViT, LinearViT, DinoVim, MambaReg)."""
import torch
from mmengine.logging import print_log
from mmpretrain.models.backbones.base_backbone import BaseBackbone
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..utils import PatchEmbed, infer_grid, resize_pos_embed
from .contract import BackboneContract, resolve_layer_indices
from .layout import TokenLayout

__all__ = ['PlainBackbone', 'resolve_layer_indices']


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class PlainBackbone(BackboneContract, BaseBackbone):
    """Patch embedding -> position embeddings -> token layout -> pre-norm blocks -> norm.

    Subclasses (the presets) set ``arch_zoo``, ``arch_keys`` (required keys of a custom dict
    arch), ``arch_defaults`` (optional keys), ``num_special`` (rows of ``cls_token`` /
    ``pos_embed_cls``) and implement ``_build_block``, ``_build_norm`` and ``token_layout``.
    Arch parsing, argument checks, freezing and the strict ``Pretrained`` init are shared with
    every backbone (:class:`~.contract.BackboneContract`).

    Parameters: ``patch_embed.proj`` (Conv2d, stride ``patch_size``); ``pos_embed``
    (1, h0*w0, C) the patch grid of ``img_size`` (resized bicubically, DINO style, to the input
    grid; a checkpoint with another grid is resized on load); ``cls_token`` and ``pos_embed_cls``
    (1, num_special, C) for the cls/register tokens; ``layers`` (blocks with ``norm1``, ``mixer``);
    ``norm`` the final norm (``nn.Identity`` if ``final_norm=False``).

    Args:
        arch (str | dict): a key of ``arch_zoo`` or a dict with the keys ``arch_keys``.
        img_size (int | tuple): training image size; sets the stored pos-embed grid.
            Defaults to 224.
        patch_size (int): patch side. Defaults to 16.
        in_channels (int): image channels. Defaults to 3.
        out_indices (int | Sequence[int]): layers whose outputs are returned (negative allowed).
            Defaults to -1.
        out_type (str): 'cls_token' (B, C), 'featmap' (B, C, h, w), 'avg_featmap' (B, C) or
            'raw' (B, L, C); every output is taken after the final norm. Defaults to 'cls_token'.
        drop_path_rate (float): stochastic depth, ``linspace(0, rate, num_layers)``. Defaults to 0.
        final_norm (bool): apply the final norm. Defaults to True.
        frozen_stages (int): freeze the embeddings and the first ``k`` layers (and the final
            norm when ``k == num_layers``); -1 or 0 freeze nothing. Defaults to -1.
        norm_eval (bool): keep batch-norm layers in eval mode while training. Defaults to False.
        with_cp (bool): activation checkpointing per block while training. Defaults to False.
        residual_in_fp32 (bool): keep the residual stream in float32. Defaults to False.
        init_cfg (dict, optional): mmengine init config; ``dict(type='Pretrained',
            checkpoint=PATH, prefix=P)`` loads the weights strictly in :meth:`init_weights`
            (``P`` e.g. ``'teacher.backbone.'`` for a DINO checkpoint; a backbone-only file is
            recognized whatever ``P``). Defaults to None.
    """
    arch_zoo: dict = {}
    arch_keys: tuple = ('embed_dims', 'num_layers')
    arch_defaults: dict = {}
    num_special: int = 1
    OUT_TYPES = ('cls_token', 'featmap', 'avg_featmap', 'raw')

    def __init__(self, arch, img_size=224, patch_size=16, in_channels=3, out_indices=-1,
                 out_type='cls_token', drop_path_rate=0., final_norm=True, frozen_stages=-1,
                 norm_eval=False, with_cp=False, residual_in_fp32=False, init_cfg=None):
        super().__init__(init_cfg)
        self.arch_settings = self._parse_arch(arch)
        self.embed_dims = self.arch_settings['embed_dims']
        self.num_layers = self.arch_settings['num_layers']
        self.patch_size, self.img_size = patch_size, _pair(img_size)
        self.pos_grid = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        self.out_type, self.final_norm = self._check_out_type(out_type), final_norm
        self.out_indices = self._resolve_layers(out_indices, 'out_indices')
        self.frozen_stages = self._check_frozen_stages(frozen_stages, self.num_layers)
        self.norm_eval, self.with_cp = norm_eval, with_cp
        self.residual_in_fp32 = residual_in_fp32
        self._layout_cache = {}

        C = self.embed_dims
        self.patch_embed = PatchEmbed(patch_size, in_channels, C)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], C))
        self.cls_token = nn.Parameter(torch.zeros(1, self.num_special, C))
        self.pos_embed_cls = nn.Parameter(torch.zeros(1, self.num_special, C))
        n = self.num_layers
        dpr = [drop_path_rate * i / max(n - 1, 1) for i in range(n)]  # linspace(0, rate, n)
        self.layers = nn.ModuleList(self._build_block(i, dpr[i]) for i in range(self.num_layers))
        self.norm = self._build_norm() if final_norm else nn.Identity()
        self._init_params()
        self._freeze_stages()

    # ---- construction -------------------------------------------------------------------
    def _build_block(self, index: int, drop_path: float) -> nn.Module:
        raise NotImplementedError

    def _build_norm(self) -> nn.Module:
        raise NotImplementedError

    def _init_params(self) -> None:
        """Truncated-normal (0.02) pos/cls embeddings; presets add their layer init."""
        for p in (self.pos_embed, self.cls_token, self.pos_embed_cls):
            nn.init.trunc_normal_(p, std=.02)

    @property
    def layer_dims(self) -> list[int]:
        """Width of each layer's tokens (``embed_dims`` for every layer of the plain trunk)."""
        return [self.embed_dims] * self.num_layers

    def _resolve_layers(self, indices, name: str) -> list[int]:
        return resolve_layer_indices(indices, self.num_layers, name)

    # ---- tokens ---------------------------------------------------------------------------
    def token_layout(self, hw: tuple[int, int]) -> TokenLayout:
        """The :class:`TokenLayout` of the sequence for a patch grid ``hw``."""
        raise NotImplementedError

    def _special_tokens(self, batch: int) -> Tensor:
        """(B, S, C) non-patch tokens in the order ``[cls] + registers + extras``."""
        return (self.cls_token + self.pos_embed_cls).expand(batch, -1, -1)

    def embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int], TokenLayout]:
        """x: (B, in_channels, H, W) -> tokens (B, L, C), patch grid ``(h, w)``, layout."""
        patches, hw = self.patch_embed(x)
        patches = patches + resize_pos_embed(self.pos_embed, self.pos_grid, hw)
        layout, order = self._cached_layout(hw, x.device)
        tokens = torch.cat([patches, self._special_tokens(x.shape[0]).to(patches.dtype)], dim=1)
        tokens = tokens.index_select(1, order)  # backward: index_add_, not index_put_
        return (tokens.float() if self.residual_in_fp32 else tokens), hw, layout

    def _cached_layout(self, hw: tuple[int, int], device) -> tuple[TokenLayout, Tensor]:
        """The layout of ``hw`` and its gather order on ``device`` (built once per grid)."""
        key = (tuple(hw), str(device))
        if key not in self._layout_cache:
            layout = self.token_layout(tuple(hw))
            self._layout_cache[key] = (layout, layout.gather_order().to(device))
        return self._layout_cache[key]

    def _apply_norm(self, x: Tensor) -> Tensor:
        weight = getattr(self.norm, 'weight', None)
        return self.norm(x if weight is None else x.to(weight.dtype))

    # ---- forward --------------------------------------------------------------------------
    def _run_layer(self, layer: nn.Module, x: Tensor, hw) -> tuple[Tensor, Tensor]:
        if self.with_cp and self.training:
            return checkpoint(layer.forward_with_mixer, x, hw, use_reentrant=False)
        return layer.forward_with_mixer(x, hw)

    def forward_layers(self, x: Tensor, layers=None, with_mixing: bool = False,
                       source: str = 'block') -> dict:
        """Run the trunk and collect per-layer tokens (and mixing matrices).

        Args:
            x (Tensor): (B, in_channels, H, W) images.
            layers (int | Sequence[int], optional): 0-based layers (negative allowed), in the
                order wanted. Defaults to all layers.
            with_mixing (bool): also return each requested layer's
                ``mixer.mixing_matrix(norm1(input), hw)``. Defaults to False.
            source (str): 'block' (the residual stream after the block, default) or 'mixer'
                (the mixer output, Dino-Mamba's linear-probe features), final-normed.

        Returns:
            dict: ``tokens`` list of (B, L, C); ``hw``; ``layout``; ``mixing`` list of
            (B, heads, L, L) (only if ``with_mixing``).
        """
        if source not in ('block', 'mixer'):
            raise ValueError(f"source={source!r} is not 'block' or 'mixer'")
        wanted = self._resolve_layers(range(self.num_layers) if layers is None else layers,
                                      'layers')
        x, hw, layout = self.embed(x)
        feats, mixing = {}, {}
        for i in range(max(wanted) + 1):
            layer = self.layers[i]
            if with_mixing and i in wanted:
                mixing[i] = layer.mixer.mixing_matrix(layer.mixer_input(x), hw)
            x, y = self._run_layer(layer, x, hw)
            if i in wanted:
                feats[i] = self._apply_norm(y if source == 'mixer' else x)
        out = dict(tokens=[feats[i] for i in wanted], hw=hw, layout=layout)
        if with_mixing:
            out['mixing'] = [mixing[i] for i in wanted]
        return out

    def cls_feature(self, tokens: Tensor, layout: TokenLayout) -> Tensor:
        """(B, L, C) -> (B, C): the cls token, or the mean over registers if there is no cls."""
        if layout.cls_index is not None:
            return tokens[:, layout.cls_index]
        if layout.register_index.numel():
            return tokens[:, layout.register_index.to(tokens.device)].mean(dim=1)
        raise ValueError(f'{type(self).__name__} has neither a cls token nor registers')

    def _format(self, tokens: Tensor, hw, layout: TokenLayout) -> Tensor:
        if self.out_type == 'raw':
            return tokens
        if self.out_type == 'cls_token':
            return self.cls_feature(tokens, layout)
        patches = tokens[:, layout.patch_index.to(tokens.device)]
        if self.out_type == 'avg_featmap':
            return patches.mean(dim=1)
        return patches.transpose(1, 2).reshape(tokens.shape[0], -1, *hw)

    def forward(self, x: Tensor) -> tuple:
        """x: (B, in_channels, H, W) -> tuple with one output per ``out_indices`` entry."""
        out = self.forward_layers(x, self.out_indices)
        return tuple(self._format(t, out['hw'], out['layout']) for t in out['tokens'])

    def get_intermediate_layers(self, x: Tensor, n: int = 1, source: str = 'block') -> list:
        """The final-normed cls feature (B, C) of each of the last ``n`` layers (oldest first).

        ``source='mixer'`` reproduces Dino-Mamba's linear-probe features (norm of the mixer
        output at the cls token / register mean) instead of the residual stream.
        """
        if not 1 <= n <= self.num_layers:
            raise ValueError(f'n={n} must be in [1, {self.num_layers}]')
        out = self.forward_layers(x, range(self.num_layers - n, self.num_layers), source=source)
        return [self.cls_feature(t, out['layout']) for t in out['tokens']]

    # ---- training state -------------------------------------------------------------------
    def _frozen_parts(self) -> tuple[list, list]:
        """``frozen_stages = k > 0``: the patch embedding, the first ``k`` layers (and the final
        norm when ``k == num_layers``) and the position / cls embeddings."""
        if self.frozen_stages <= 0:
            return [], []
        modules = [self.patch_embed, *self.layers[:self.frozen_stages]]
        if self.frozen_stages == self.num_layers:
            modules.append(self.norm)
        return modules, [self.pos_embed, self.cls_token, self.pos_embed_cls]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'pos_embed'
        own = self.pos_embed.shape
        if key in state_dict and state_dict[key].ndim == 3 and state_dict[key].shape[2] == own[2] \
                and state_dict[key].shape[1] != own[1]:
            src = state_dict[key]
            src_grid = infer_grid(src.shape[1])
            state_dict[key] = resize_pos_embed(src, src_grid, self.pos_grid)
            print_log(f'{type(self).__name__}: resized {key} from grid {src_grid} to '
                      f'{self.pos_grid}', logger='current')
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
