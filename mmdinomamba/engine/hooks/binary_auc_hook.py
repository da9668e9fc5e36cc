"""Evaluate Binary-AUC of the (teacher) backbone during pretraining.

Every ``interval`` epochs (or iterations with ``by_epoch=False``) and after the last epoch, the
hook runs the backbone on a held-out loader with foreground masks, computes CLS-to-patch maps
(:func:`~mmdinomamba.analysis.featmaps.compute_featmaps`) and their Binary-AUC
(:class:`~mmdinomamba.evaluation.BinaryAUC`), logs the values (logger, ``runner.message_hub``
scalars ``binary_auc/*``, ``runner.visualizer.add_scalars`` so every vis backend — local JSON,
TensorBoard when configured — receives them) and writes a few example map figures as PNGs into
``<log_dir>/binary_auc/`` and through ``runner.visualizer.add_image`` (main process only).
"""
import os.path as osp
from operator import attrgetter
from typing import Optional, Sequence, Union

from mmengine.dist import is_main_process
from mmpretrain.registry import HOOKS, MODELS
from mmpretrain.utils import get_ori_model

from mmdinomamba.analysis.backbone_eval import evaluate_binary_auc
from mmdinomamba.datasets.normalization import imagenet_preprocessor
from mmdinomamba.models.utils import BACKBONE_PREFIXES
from .periodic import PeriodicEvalHook

#: attribute paths of the backbones, in the order of the checkpoint prefixes (teacher first)
BACKBONE_PATHS = tuple(prefix.rstrip('.') for prefix in BACKBONE_PREFIXES)


def find_backbone(model, paths: Sequence[str] = BACKBONE_PATHS):
    """The first of ``paths`` that exists on the (unwrapped) model: teacher before student."""
    model = get_ori_model(model)
    for path in paths:
        try:
            return attrgetter(path)(model)
        except AttributeError:
            continue
    raise AttributeError(f'BinaryAUCHook: model {type(model).__name__} has none of {paths}')


@HOOKS.register_module()
class BinaryAUCHook(PeriodicEvalHook):
    """Binary-AUC of the teacher backbone on a held-out loader during training.

    Args:
        dataloader (dict | DataLoader): loader whose samples carry ``gt_seg_map`` (pipeline with
            ``LoadFgMask`` and ``PackInputs(algorithm_keys=['gt_seg_map'])``).
        interval (int): evaluate every ``interval`` epochs (iterations if not ``by_epoch``).
            Defaults to 1.
        by_epoch (bool): epoch- or iteration-based interval. Defaults to True.
        map_type, layers, query, cosine_heads, head_reduce: see ``compute_featmaps``.
        num_thresholds (int, optional): None = exact AUC. Defaults to None.
        mask_resize (str): 'area' or 'nearest'. Defaults to 'area'.
        data_preprocessor (dict, optional): defaults to ImageNet ``ClsDataPreprocessor``.
        num_examples (int): example figures saved per evaluation. Defaults to 2.
        prefix (str): metric key prefix. Defaults to 'binary_auc'.
    """

    def __init__(self, dataloader, interval: int = 1, by_epoch: bool = True,
                 map_type: str = 'mixing', layers: Optional[Union[int, Sequence[int]]] = (-1, ),
                 query: str = 'auto', cosine_heads: int = 1, head_reduce: Optional[str] = None,
                 num_thresholds: Optional[int] = None, mask_resize: str = 'area',
                 data_preprocessor: Optional[dict] = None, num_examples: int = 2,
                 prefix: str = 'binary_auc'):
        super().__init__(interval, by_epoch)
        self._loader = dataloader
        self.featmap_cfg = dict(map_type=map_type, layers=layers, query=query,
                                cosine_heads=cosine_heads, head_reduce=head_reduce)
        self.metric_cfg = dict(num_thresholds=num_thresholds, mask_resize=mask_resize,
                               prefix=prefix)
        self.preprocessor = MODELS.build(data_preprocessor or imagenet_preprocessor())
        self.num_examples = num_examples

    def _dataloader(self, runner):
        if isinstance(self._loader, dict):
            self._loader = runner.build_dataloader(self._loader, seed=runner.seed)
        return self._loader

    def evaluate(self, runner, step: int) -> dict:
        """Run the evaluation now; returns and logs the metrics."""
        metrics, examples = evaluate_binary_auc(
            find_backbone(runner.model), self._dataloader(runner), self.preprocessor,
            self.featmap_cfg, self.metric_cfg, num_examples=self.num_examples)
        main = {k: round(v, 2) for k, v in metrics.items()
                if k.rsplit('/', 1)[-1] in ('auc', 'auc_norm', 'skipped', 'num_images')}
        self.publish(runner, metrics, step, 'Binary-AUC',
                     f' ({self.featmap_cfg["map_type"]} maps, %): {main}')
        self._save_examples(runner, examples, step)
        return metrics

    def _save_examples(self, runner, examples, step: int) -> None:
        if not examples or not is_main_process():
            return
        from mmdinomamba.analysis import plots
        for i, (img, maps, auc, fm) in enumerate(examples):
            out = osp.join(runner.log_dir, 'binary_auc', f'step{step}_img{i}.png')
            img = plots.preprocessor_image(img, self.preprocessor)
            arr = plots.plot_featmap_grid(img, maps, fm.layers,
                                          fm.query_index, out_file=out, aucs=auc,
                                          title=f'{fm.map_type} maps, step {step}')
            runner.visualizer.add_image(f'binary_auc_img{i}', arr, step=step)
