"""A model that turns a backbone into CLS-to-patch feature maps for the Binary-AUC metric.

An evaluation adapter of the analysis floor (registered as ``type='FeatMapEvaluator'`` in
mmpretrain's ``MODELS``): ``python tools/test.py configs/analysis/<config> CKPT`` runs
``FeatMapEvaluator.test_step``: the data preprocessor normalizes the images,
:func:`~mmdinomamba.analysis.featmaps.compute_featmaps` runs the backbone's ``forward_layers``, and
:func:`~mmdinomamba.evaluation.binary_auc.fill_featmap_samples` writes the maps into every data
sample (``pred_featmap`` (num_layers, heads, R, h, w), min-max normalized to [0, 1], and the
metainfo ``featmap_layers`` / ``featmap_type`` / ``query_index``), as
:func:`~mmdinomamba.analysis.backbone_eval.evaluate_binary_auc` does for ``BinaryAUCHook``.

Checkpoints: a DINO checkpoint holds ``backbone.*`` (student) and ``teacher.backbone.*``
(teacher); a converted one holds the backbone keys, bare or under ``backbone.``. A load hook maps
the first prefix of ``ckpt_prefixes`` found in the state dict onto ``backbone.`` (teacher first by
default, as DINO evaluates the teacher), or bare backbone keys, and drops every other key (the
evaluator holds nothing but the backbone). ``tools/test.py`` then loads strictly: a checkpoint of
another backbone is an error naming the file and the keys.
A backbone ``init_cfg`` (e.g. ``dict(type='Pretrained', checkpoint=..., prefix=...)``) is applied
(strictly) at construction, since ``Runner.test()`` does not initialize weights.
"""
from typing import List, Optional, Sequence, Union

import torch
from mmengine.model import BaseModel
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

from mmdinomamba.datasets.normalization import imagenet_preprocessor
from mmdinomamba.evaluation.binary_auc import fill_featmap_samples
from mmdinomamba.models.utils import (BACKBONE_PREFIXES, add_prefix, backbone_state_dict,
                                      strip_prefix)
from .featmaps import compute_featmaps

__all__ = ['FeatMapEvaluator']


@MODELS.register_module()
class FeatMapEvaluator(BaseModel):
    """Backbone + feature-map extraction, for evaluation only.

    Args:
        backbone (dict): backbone config (``ViT``, ``LinearViT``, ``DinoVim``, ``MambaReg``, ...).
        map_type (str): 'mixing' (query row of the mixing matrix) or 'cosine' (cosine similarity
            of the query feature to patch features). Defaults to 'mixing'.
        layers (Sequence[int] | None): layers to map (negative allowed, None = all).
            Defaults to (-1,).
        query (str): 'auto', 'cls', 'registers' or 'mean' (MILA). Defaults to 'auto'.
        cosine_heads (int): channel chunks for 'cosine'. Defaults to 1.
        head_reduce (str | None): None (one map per head) or 'mean'. Defaults to None.
        ckpt_prefixes (Sequence[str]): state-dict prefixes mapped onto ``backbone.``, in order of
            preference. Defaults to teacher, EMA teacher, student.
        data_preprocessor (dict, optional): defaults to ImageNet ``ClsDataPreprocessor``.
        init_cfg (dict, optional): initialization config. Defaults to None.
    """

    def __init__(self, backbone: dict, map_type: str = 'mixing',
                 layers: Optional[Union[int, Sequence[int]]] = (-1, ), query: str = 'auto',
                 cosine_heads: int = 1, head_reduce: Optional[str] = None,
                 ckpt_prefixes: Sequence[str] = BACKBONE_PREFIXES,
                 data_preprocessor: Optional[dict] = None, init_cfg: Optional[dict] = None):
        if data_preprocessor is None:
            data_preprocessor = imagenet_preprocessor()
        if isinstance(data_preprocessor, dict):
            data_preprocessor.setdefault('type', 'ClsDataPreprocessor')
            data_preprocessor = MODELS.build(data_preprocessor)
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        if backbone.get('init_cfg'):  # Runner.test() never calls init_weights
            self.backbone.init_weights()
        self.featmap_cfg = dict(layers=layers, map_type=map_type, query=query,
                                cosine_heads=cosine_heads, head_reduce=head_reduce)
        self.ckpt_prefixes = tuple(ckpt_prefixes)
        self.register_load_state_dict_pre_hook(FeatMapEvaluator._remap_checkpoint_keys)

    def _remap_checkpoint_keys(self, state_dict, prefix, *args) -> None:
        """Load pre-hook: keep only the preferred backbone weights, as ``backbone.*``.

        The evaluator is a backbone and nothing else: the backbone is picked out of the state
        dict by :func:`~mmdinomamba.models.utils.backbone_state_dict` (the first of
        ``ckpt_prefixes`` present, else a backbone-only file) and every other key of the
        checkpoint (DINO heads, ``dino_loss.center``, the student when the teacher is used, a
        classifier's head) is dropped. The backbone then loads as usual: strictly with
        ``tools/test.py``, which reports any key that does not fit.

        Raises:
            KeyError: the state dict holds nothing that looks like backbone weights.
        """
        own = [k for k in state_dict if k.startswith(prefix)]
        picked, _ = backbone_state_dict(strip_prefix(state_dict, prefix, keep_only=True),
                                        self.backbone.state_dict().keys(), self.ckpt_prefixes,
                                        source='the checkpoint given to FeatMapEvaluator')
        for k in own:
            del state_dict[k]
        moved = add_prefix(picked, prefix + 'backbone.')
        state_dict.update(moved)
        metadata = getattr(state_dict, '_metadata', None)
        if metadata is not None:  # the loader reads each module's metadata from this object
            metadata.update(moved._metadata)

    def forward(self, inputs: torch.Tensor, data_samples: Optional[List[DataSample]] = None,
                mode: str = 'predict'):
        """Compute maps.

        Args:
            inputs (Tensor): (B, 3, H, W) preprocessed images.
            data_samples (list[DataSample], optional): samples to fill. Defaults to None.
            mode (str): 'predict' (fill data samples) or 'tensor' (return the maps
                (B, num_layers, heads, R, h, w)). Defaults to 'predict'.
        """
        if mode not in ('predict', 'tensor'):
            raise RuntimeError(f"FeatMapEvaluator supports mode 'predict' or 'tensor', got "
                               f'{mode!r} (it is an evaluation-only model)')
        fm = compute_featmaps(self.backbone, inputs, **self.featmap_cfg)
        if mode == 'tensor':
            return fm.maps
        if data_samples is None:
            data_samples = [DataSample() for _ in range(inputs.shape[0])]
        return fill_featmap_samples(data_samples, fm)
