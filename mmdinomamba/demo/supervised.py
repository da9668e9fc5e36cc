"""The demo's supervised baseline (paper Figure 4(a)): the DINO run's backbone, trained from
scratch with cross-entropy on the labels of the same data, same image size and batch.

:func:`supervised_config` writes its config (the demo's DINO backbone, data folder, number of
classes and epochs filled in) next to the DINO run's; ``tools/demo.py`` trains it with
``tools/train.py`` and evaluates the frozen backbone like the teacher (prefix ``backbone.``).
"""
import os
import os.path as osp

__all__ = ['SUPERVISED_CONFIG', 'supervised_config', 'PREFIX']

#: the baseline's config (inherits the tiny classification config of the demo backbone)
SUPERVISED_CONFIG = 'configs/classification/dinovim-demo_1xb32-14e_supervised-baseline-64px.py'
#: where the backbone's weights are in its checkpoints
PREFIX = 'backbone.'


def supervised_config(root: str, data, dino_cfg, run_dir: str, options: dict = None) -> str:
    """Write ``<run_dir>/supervised_config.py`` and return its path.

    Args:
        root (str): the repository (the config path is relative to it).
        data (DemoData): the data folder.
        dino_cfg (Config): the DINO run's config: its backbone, batch size, image size (global
            crop) and epochs are used, so both runs see the same data at the same size for the
            same number of epochs.
        run_dir (str): where to write.
        options (dict, optional): overrides of the supervised config.
    """
    from mmdinomamba.utils.cli import load_config
    cfg = load_config(osp.join(root, SUPERVISED_CONFIG), options or None)
    backbone = dino_cfg.model.backbone.to_dict()
    backbone.pop('_delete_', None)
    size = backbone.get('img_size', 64)
    cfg.model.backbone = backbone
    cfg.model.head.update(num_classes=len(data.classes),
                          in_channels=dino_cfg.model.head.in_channels)
    cfg.data_preprocessor.num_classes = len(data.classes)
    loader = cfg.train_dataloader
    loader.batch_size = dino_cfg.train_dataloader.batch_size
    loader.num_workers = dino_cfg.train_dataloader.get('num_workers', 0)
    loader.dataset.update(type=data.dataset_type, data_root=data.root, split='train')
    if data.generated:
        loader.dataset['generate'] = False
    else:  # a folder of the user's: its dataset type takes no `generate`
        loader.dataset.pop('generate', None)
    for step in loader.dataset.pipeline:
        if step['type'] == 'Resize':
            step['scale'] = (size, size)
    epochs = dino_cfg.train_cfg.max_epochs
    cfg.train_cfg.update(max_epochs=epochs, val_interval=epochs + 1)
    for sched in cfg.param_scheduler:
        if sched.get('by_epoch') and 'end' in sched:
            sched['end'] = epochs
    cfg.randomness = dino_cfg.get('randomness', cfg.get('randomness'))
    os.makedirs(run_dir, exist_ok=True)
    path = osp.join(run_dir, 'supervised_config.py')
    cfg.dump(path)
    return path
