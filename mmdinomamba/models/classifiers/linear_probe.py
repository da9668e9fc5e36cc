"""Linear probing of a frozen backbone (the paper's Tables 1, 5 and 6).

Protocol of DINO's ``eval_linear`` and Dino-Mamba's ``eval_linear_vim`` / ``eval_linear_mambar``:
the backbone is frozen and always in eval mode; the feature is the concatenation of the pooled,
final-normed tokens of the last ``n`` blocks (:class:`ProbeFeatureNeck`); a linear layer
(no BatchNorm, weight N(0, 0.01), bias 0) is trained on top with SGD.

"Heavy-weight probing heads" (Table 1, lower half). The paper does not describe them in words;
its head-size column pins them down: 1000 classes x feature size gives the listed sizes for
LINEAR heads on more concatenated blocks: DinoVim-T 256 x 8 blocks -> 2.0M, DinoVim-S 512 x 4
-> 2.0M, DinoVim-B / Mamba-Reg-B 768 x 8 -> 6.1M (printed as 6.2), which is also the official
release's ``n_last_blocks`` (8 for T/B, 4 for S; yangtiming/Dino-Mamba README). The upper half
uses ~1.5M-parameter heads: ViT-S 384 x 4, ViT-B / LinearViT-B 768 x (1 block + avgpool),
DinoVim-S 512 x 3, DinoVim-B 768 x 2. So the heavy-weight head here is the same linear head with
a larger ``num_blocks``; no MLP is involved.
"""
import copy
import hashlib
from typing import Optional

import torch
from mmengine.logging import print_log
from mmpretrain.models.classifiers import ImageClassifier
from mmpretrain.registry import MODELS
from torch import nn

from ..necks.probe_neck import POOLINGS
from ..utils import load_backbone_checkpoint, split_pretrained_cfg

__all__ = ['LinearProbe', 'FeatureCache']

SOURCES = ('block', 'mixer')


class FeatureCache:
    """Probe features keyed by the exact bytes of each preprocessed input image.

    Valid only because the probed backbone is frozen and deterministic (eval mode, no dropout):
    the same input always gives the same feature. Meant for small data sets (the embedded demo:
    ~3k unique inputs of 64 px); ``max_items`` bounds the memory (no new entries beyond it).
    """

    def __init__(self, max_items: int = 100_000):
        self.max_items, self.store = max_items, {}

    @staticmethod
    def key(image: torch.Tensor) -> bytes:
        data = image.detach().to('cpu', torch.float32).contiguous().numpy().tobytes()
        return hashlib.blake2b(data, digest_size=16).digest() + str(tuple(image.shape)).encode()

    def lookup(self, inputs: torch.Tensor, compute) -> torch.Tensor:
        """inputs: (B, ...) -> (B, D) features, calling ``compute(inputs[miss])`` for misses."""
        keys = [self.key(x) for x in inputs]
        miss = [i for i, k in enumerate(keys) if k not in self.store]
        if miss:
            fresh = compute(inputs[miss])
            for i, f in zip(miss, fresh):
                if len(self.store) < self.max_items:
                    self.store[keys[i]] = f.detach().cpu()
        out, fresh_at = [], {i: j for j, i in enumerate(miss)}
        for i, k in enumerate(keys):
            out.append(fresh[fresh_at[i]] if i in fresh_at else self.store[k].to(inputs.device))
        return torch.stack(out)


@MODELS.register_module()
class LinearProbe(ImageClassifier):
    """Frozen backbone -> pooled features of the last ``num_blocks`` blocks -> linear head.

    The backbone must follow the backbone contract (``forward_layers``, ``token_layout``,
    ``num_layers``, ``embed_dims``, ``layer_dims``; ViT, LinearViT, DinoVim, MambaReg, MILA). MILA
    has no cls token (pool with ``neck=dict(type='ProbeFeatureNeck', pooling='mean')``) and its
    probed blocks must lie in its last stage (``num_blocks`` up to that stage's depth). The
    backbone's parameters get ``requires_grad=False``, its features are computed under
    ``torch.no_grad()`` and it stays in eval mode when the runner calls ``model.train()`` (no
    stochastic depth / dropout).

    Backbone weights: ``backbone.init_cfg=dict(type='Pretrained', checkpoint=PATH, prefix=P)``,
    e.g. ``prefix='teacher.backbone.'`` for a DINO checkpoint of this package (DINO evaluates the
    teacher); a backbone-only file (keys bare or under ``backbone.``: written by
    ``tools/model_converters/extract_backbone.py`` or a converted official checkpoint) is
    accepted whatever the prefix. Unlike mmengine's non-strict ``Pretrained`` init, the weights
    are loaded strictly in :meth:`init_weights` (a wrong prefix must not silently leave a random
    backbone), by :func:`~mmdinomamba.models.utils.load_backbone_checkpoint` like every
    backbone's ``Pretrained`` init. ``checkpoint=None`` (or ``init_cfg=None``) gives a randomly
    initialized backbone (the honest baseline of a probe), with a log message.

    Args:
        backbone (dict): backbone config.
        head (dict): head config, e.g. ``LinearClsHead``; ``in_channels`` may be omitted (it is
            set to the neck's feature size) and must match it when given.
        neck (dict, optional): feature config. Defaults to ``ProbeFeatureNeck`` (pooling 'cls').
        num_blocks (int): concatenate the last ``n`` blocks (Table 5: 1-4). Defaults to 4.
        feature_source (str): 'block' (each block's output, the residual stream, final-normed:
            DINO's ``get_intermediate_layers``) or 'mixer' (the final norm applied to each
            block's MIXER output: Dino-Mamba's DinoVim / Mamba-Reg probe). Defaults to 'block'.
        feature_cache (bool): memoize the probe feature of every distinct input image
            (:class:`FeatureCache`); a pure speed-up for small data sets with few distinct
            augmented views (the embedded demo), exact because the backbone is frozen.
            Defaults to False.
        data_preprocessor (dict, optional): see ``ImageClassifier``.
        train_cfg (dict, optional): see ``ImageClassifier``.
        init_cfg (dict, optional): init config of the whole model. Defaults to None.
    """

    def __init__(self, backbone: dict, head: dict, neck: Optional[dict] = None,
                 num_blocks: int = 4, feature_source: str = 'block',
                 feature_cache: bool = False, data_preprocessor: Optional[dict] = None,
                 train_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        if feature_source not in SOURCES:
            raise ValueError(f'LinearProbe: feature_source={feature_source!r} is not one of '
                             f'{SOURCES}')
        backbone, head = copy.deepcopy(dict(backbone)), copy.deepcopy(dict(head))
        pretrained, backbone['init_cfg'] = split_pretrained_cfg(backbone.get('init_cfg'))
        backbone = MODELS.build(backbone)
        for attr in ('forward_layers', 'token_layout', 'num_layers', 'embed_dims'):
            if not hasattr(backbone, attr):
                raise TypeError(f'LinearProbe: backbone {type(backbone).__name__} has no '
                                f'{attr!r} (see docs/CONTRACTS.md, "Backbones")')
        if not 1 <= num_blocks <= backbone.num_layers:
            raise ValueError(f'LinearProbe: num_blocks={num_blocks} must be in '
                             f'[1, {backbone.num_layers}] for this backbone')
        neck = MODELS.build(neck or dict(type='ProbeFeatureNeck'))
        head['in_channels'] = self._feature_size(backbone, neck, num_blocks, head)
        super().__init__(backbone=backbone, neck=neck, head=head, train_cfg=train_cfg,
                         data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.num_blocks, self.feature_source = num_blocks, feature_source
        self.backbone_pretrained = pretrained
        self.feature_cache = FeatureCache() if feature_cache else None
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    @staticmethod
    def _feature_size(backbone: nn.Module, neck: nn.Module, num_blocks: int, head: dict) -> int:
        name = type(backbone).__name__
        widths = sorted(set(getattr(backbone, 'layer_dims',
                                    [backbone.embed_dims] * backbone.num_layers)[-num_blocks:]))
        if len(widths) > 1:
            raise ValueError(f'LinearProbe: the last num_blocks={num_blocks} blocks of {name} '
                             f'have different widths {widths} (they span stages); use fewer '
                             'blocks, all in the last stage')
        layout = backbone.token_layout(tuple(getattr(backbone, 'pos_grid', (2, 2))))
        if layout.cls_index is None and not layout.register_index.numel() and \
                'cls' in POOLINGS.get(getattr(neck, 'pooling', None), ()):
            raise ValueError(f"LinearProbe: pooling {neck.pooling!r} needs a cls token or "
                             f"registers, and {name} has neither: use neck=dict("
                             "type='ProbeFeatureNeck', pooling='mean') (or 'max')")
        size = neck.out_channels(widths[0], num_blocks, layout.register_index.numel())
        given = head.get('in_channels')
        if given is not None and given != size:
            raise ValueError(f'LinearProbe: head.in_channels={given} but the probe feature has '
                             f'{size} channels (block width {widths[0]}, '
                             f'num_blocks={num_blocks}, neck={neck.pooling!r}, '
                             f'avgpool={neck.avgpool}); omit head.in_channels to set it '
                             'automatically')
        return size

    # ---- weights / training state -----------------------------------------------------------
    def init_weights(self) -> None:
        """Initialize the head (DINO: N(0, 0.01), bias 0), then load the backbone strictly."""
        super().init_weights()
        self._load_backbone()
        if self.feature_cache is not None:
            self.feature_cache.store.clear()

    def _load_backbone(self) -> None:
        cfg = self.backbone_pretrained
        if cfg is None or cfg.get('checkpoint') is None:
            print_log('LinearProbe: no backbone checkpoint (init_cfg.checkpoint is None): '
                      'probing a RANDOMLY INITIALIZED backbone', logger='current')
            return
        path = cfg['checkpoint']
        count, prefix, skipped = load_backbone_checkpoint(self.backbone, path, cfg.get('prefix'))
        print_log(f'LinearProbe: loaded {count} backbone tensors from {path} '
                  f'(prefix {prefix!r}), strictly' +
                  (f'; not in the checkpoint: {skipped}' if skipped else ''), logger='current')

    def _load_from_state_dict(self, *args, **kwargs):
        if self.feature_cache is not None:  # new weights: memoized features are stale
            self.feature_cache.store.clear()
        super()._load_from_state_dict(*args, **kwargs)

    def train(self, mode: bool = True):
        """Train mode for the head only: the frozen backbone always stays in eval mode."""
        super().train(mode)
        self.backbone.eval()
        return self

    # ---- features ---------------------------------------------------------------------------
    def extract_feat(self, inputs: torch.Tensor, stage: str = 'neck'):
        """inputs: (B, 3, H, W) -> ``stage`` 'backbone': n x (B, L, C) token sequences;
        'neck': ((B, D),) probe features; 'pre_logits': what the head's ``pre_logits`` returns."""
        if stage not in ('backbone', 'neck', 'pre_logits'):
            raise ValueError(f'LinearProbe.extract_feat: invalid stage {stage!r}')
        if stage == 'backbone':
            return tuple(self._tokens(inputs)[0])
        if self.feature_cache is None:
            feats = self._features(inputs)
        else:
            feats = self.feature_cache.lookup(inputs, self._features)
        return (feats, ) if stage == 'neck' else self.head.pre_logits((feats, ))

    def _tokens(self, inputs: torch.Tensor) -> tuple:
        """(B, 3, H, W) -> (n x (B, L, C) final-normed tokens of the last blocks, layout)."""
        n_layers = self.backbone.num_layers
        with torch.no_grad():
            out = self.backbone.forward_layers(inputs, range(n_layers - self.num_blocks, n_layers),
                                               source=self.feature_source)
        return [t.float() for t in out['tokens']], out['layout']

    def _features(self, inputs: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D) probe features."""
        tokens, layout = self._tokens(inputs)
        return self.neck(tokens, layout)[0]
