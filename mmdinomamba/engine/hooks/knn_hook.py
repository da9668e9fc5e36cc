"""k-NN top-1 of the (teacher) backbone's frozen features during training, DINO's way.

Every ``interval`` epochs (or iterations with ``by_epoch=False``) and after the last one, the
hook computes the backbone's final feature (the cls token) of every image of a labelled memory
bank (``train_dataloader``) and of a held-out set (``val_dataloader``), classifies the held-out
features by DINO's weighted k-NN (:func:`~mmdinomamba.evaluation.knn.knn_predict`: cosine
similarity, ``k`` neighbours, votes ``exp(cos / temperature)``) and logs ``<prefix>/top1`` (%) to
the logger, ``runner.message_hub`` and every visualizer backend (TensorBoard when configured).

The loaders run whole on every process (no distributed sampler), so each process gets the same,
complete number.

    custom_hooks = [dict(type='KNNEvalHook', interval=1,
                         train_dataloader=dict(batch_size=64, dataset=...),
                         val_dataloader=dict(batch_size=64, dataset=...))]
"""
from typing import Optional

import torch
from mmengine.dataset import pseudo_collate
from mmpretrain.registry import DATASETS, HOOKS, MODELS

from mmdinomamba.analysis.backbone_eval import backbone_features
from mmdinomamba.datasets.normalization import imagenet_preprocessor
from mmdinomamba.evaluation.knn import knn_predict
from .binary_auc_hook import find_backbone
from .periodic import PeriodicEvalHook


def _loader(cfg, name: str):
    """A loader over the whole data set in order (an already built loader is used as given)."""
    if not isinstance(cfg, dict):
        return cfg
    if 'dataset' not in cfg:
        raise KeyError(f'KNNEvalHook: {name} needs a "dataset" key, got keys {sorted(cfg)}')
    dataset = cfg['dataset']
    if isinstance(dataset, dict):
        dataset = DATASETS.build(dataset)
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.get('batch_size', 64),
                                       num_workers=cfg.get('num_workers', 0),
                                       shuffle=False, collate_fn=pseudo_collate)


@HOOKS.register_module()
class KNNEvalHook(PeriodicEvalHook):
    """Weighted k-NN top-1 of the teacher backbone's frozen features during training.

    Args:
        train_dataloader (dict | DataLoader): the labelled memory bank (a dict with ``dataset``
            and optional ``batch_size`` / ``num_workers``; the pipeline packs ``gt_label``).
        val_dataloader (dict | DataLoader): the images to classify, same form.
        interval (int): every ``interval`` epochs (iterations if not ``by_epoch``). Defaults to 1.
        by_epoch (bool): epoch- or iteration-based interval. Defaults to True.
        k (int): neighbours that vote. Defaults to 20 (DINO).
        temperature (float): vote weight ``exp(cos / temperature)``. Defaults to 0.07 (DINO).
        num_classes (int, optional): defaults to the largest label seen + 1.
        data_preprocessor (dict, optional): defaults to ImageNet ``ClsDataPreprocessor``.
        prefix (str): metric key prefix. Defaults to 'knn'.
    """

    def __init__(self, train_dataloader, val_dataloader, interval: int = 1,
                 by_epoch: bool = True, k: int = 20, temperature: float = 0.07,
                 num_classes: Optional[int] = None, data_preprocessor: Optional[dict] = None,
                 prefix: str = 'knn'):
        if k < 1 or temperature <= 0:
            raise ValueError(f'KNNEvalHook: need k >= 1 and temperature > 0, got k={k}, '
                             f'temperature={temperature}')
        super().__init__(interval, by_epoch)
        self._loaders = dict(train_dataloader=train_dataloader, val_dataloader=val_dataloader)
        self.k, self.temperature, self.num_classes = k, temperature, num_classes
        self.preprocessor = MODELS.build(data_preprocessor or imagenet_preprocessor())
        self.prefix = prefix

    def compute(self, backbone) -> dict:
        """``{prefix/top1: %}`` of ``backbone`` on the two loaders."""
        for name, cfg in self._loaders.items():
            self._loaders[name] = _loader(cfg, name)
        ftr, ytr = backbone_features(backbone, self._loaders['train_dataloader'],
                                     self.preprocessor)
        fva, yva = backbone_features(backbone, self._loaders['val_dataloader'],
                                     self.preprocessor)
        nc = self.num_classes or int(max(ytr.max(), yva.max())) + 1
        pred = knn_predict(ftr, ytr, fva, nc, k=self.k, temperature=self.temperature)
        return {f'{self.prefix}/top1': 100. * float((pred == yva).float().mean())}

    def evaluate(self, runner, step: int) -> dict:
        """Run the evaluation now; returns and logs the metrics."""
        metrics = self.compute(find_backbone(runner.model))
        self.publish(runner, metrics, step, f'k-NN (k={self.k}, T={self.temperature})',
                     ': ' + ', '.join(f'{k} {v:.2f}' for k, v in metrics.items()))
        return metrics
