"""Everything the demo writes after its runs: figures, ``summary.json`` and ``report.md``."""
import os
import os.path as osp
import statistics
import time

import numpy as np
import torch

from mmdinomamba.analysis.pca import pca_rgb
from mmdinomamba.analysis import plots
from . import figures
from .report import auc_by_layer, auc_during_training, build_summary, render_report, \
    write_summary

__all__ = ['write_outputs']


def _example_masks(loaders, n: int = 4):
    """Full-resolution foreground masks of the first ``n`` Binary-AUC images."""
    if loaders.masks is None:
        return None
    ds = loaders.masks.dataset
    return [np.asarray(ds[i]['data_samples'].gt_seg_map) == 1 for i in range(min(n, len(ds)))]


@torch.no_grad()
def _pca(backbone, inputs):
    out = backbone.forward_layers(inputs, layers=[backbone.num_layers - 1])
    tokens = out['tokens'][0][:, out['layout'].patch_index]
    return list(pca_rgb(tokens.float(), tuple(out['hw'])).numpy())


def _figures(run: dict, out_dir: str, name: str) -> list:
    """The figures of one mixer's run; returns their paths."""
    from .evaluate import build_backbone
    os.makedirs(out_dir, exist_ok=True)
    cfg, teacher, randoms, loaders = run['cfg'], run['teacher'], run['random'], run['loaders']
    out_dim = cfg.model.head.out_channels
    paths = [figures.training_curves(run['scalars'], out_dim,
                                     cfg.train_dataloader.batch_size * 2,
                                     osp.join(out_dir, 'training_curves.png'))]
    curve = auc_during_training(run['scalars'])
    rand_layers = [auc_by_layer(r['binary_auc']) for r in randoms if r.get('binary_auc')]
    rand_mean = ({k: statistics.fmean(d[k] for d in rand_layers) for k in rand_layers[0]}
                 if rand_layers else None)
    if curve:
        paths.append(figures.auc_during_training_figure(
            curve, rand_mean, osp.join(out_dir, 'auc_during_training.png')))
    sup = run.get('supervised')
    if teacher.get('binary_auc'):
        models = {f'{name} DINO teacher': [teacher]}
        if sup is not None:
            models[f'{name} supervised'] = [sup]
        models[f'{name} random init'] = randoms
        paths.append(figures.auc_per_layer_figure(models, osp.join(out_dir, 'auc_per_layer.png')))
        examples = {'DINO teacher': teacher['examples']}
        if sup is not None:
            examples['supervised'] = sup['examples']
        examples['random init (seed 0)'] = randoms[0]['examples']
        masks = _example_masks(loaders)
        paths.append(figures.maps_figure(examples, loaders.preprocessor,
                                         osp.join(out_dir, 'maps.png'), masks))
        head_examples = {'DINO teacher': teacher['head_examples']}
        if sup is not None:
            head_examples['supervised'] = sup['head_examples']
        head_examples['random init (seed 0)'] = randoms[0]['head_examples']
        paths.append(figures.heads_figure(head_examples, loaders.preprocessor,
                                          osp.join(out_dir, 'heads.png'), masks))
        inputs = torch.stack([e[0] for e in teacher['examples']])
        images = [plots.preprocessor_image(x, loaders.preprocessor) for x in inputs]
        rgbs = {'DINO teacher': _pca(build_backbone(run['bb_cfg'], run['checkpoint']), inputs)}
        if sup is not None:
            rgbs['supervised'] = _pca(build_backbone(run['bb_cfg'], run['supervised_checkpoint'],
                                                     prefix='backbone.'), inputs)
        rgbs['random init'] = _pca(build_backbone(run['bb_cfg'], seed=0), inputs)
        paths.append(figures.pca_figure(images, rgbs, osp.join(out_dir, 'pca.png')))
    return paths


def write_outputs(work_dir: str, runs: dict, data, times: dict, start: float) -> str:
    """Write the figures, ``summary.json`` and ``report.md`` of all runs into ``work_dir``
    (one mixer: at its top; several: each in ``<work_dir>/<mixer>/`` plus a comparison at the
    top). Returns the report's text."""
    summaries, sections = {}, []
    for name, run in runs.items():
        out_dir = work_dir if len(runs) == 1 else osp.join(work_dir, name)
        figs = _figures(run, out_dir, name)
        summaries[name] = build_summary(run['teacher'], run['random'], run['scalars'],
                                        len(data.classes), run['cfg'].model.head.out_channels,
                                        time.perf_counter() - start, run.get('supervised'),
                                        run.get('collapse'), run.get('adapt'))
        notes = [] if data.has_masks else ['no masks: Binary-AUC skipped']
        if not run['teacher']['probe_converged']:
            notes.append('the teacher linear probe stopped before its tolerance')
        text = render_report(summaries[name], run['config'], data.root,
                             [osp.relpath(f, out_dir) for f in figs], times, notes)
        with open(osp.join(out_dir, 'report.md'), 'w') as f:
            f.write(text)
        write_summary(osp.join(out_dir, 'summary.json'), summaries[name])
        sections.append(text)
    if len(runs) == 1:
        return sections[0]
    first = summaries[next(iter(runs))]
    write_summary(osp.join(work_dir, 'summary.json'), dict(first, mixers=summaries))
    fig = figures.mixers_figure(summaries, osp.join(work_dir, 'mixers.png'))
    table = _mixers_table(summaries)
    text = '\n'.join(['# mmdinomamba demo: token mixers compared', '', *table, '',
                      f'![mixers]({osp.relpath(fig, work_dir)})', '',
                      'Per-mixer reports: ' + ', '.join(f'`{n}/report.md`' for n in runs)])
    with open(osp.join(work_dir, 'report.md'), 'w') as f:
        f.write(text + '\n')
    return text


def _mixers_table(summaries: dict) -> list:
    keys = [('knn_top1', 'k-NN'), ('linear_top1', 'linear'), ('binary_auc_mean', 'Binary-AUC')]
    keys = [k for k in keys if all(k[0] in s for s in summaries.values())]
    head = ' | '.join(f'{label} teacher | {label} random (mean of seeds)' for _, label in keys)
    lines = [f'| mixer | {head} |', '|---' * (1 + 2 * len(keys)) + '|']
    for name, s in summaries.items():
        cells = ' | '.join(f'{s[k]["teacher"]:.1f} | {statistics.fmean(s[k]["random"]):.1f}'
                           for k, _ in keys)
        lines.append(f'| {name} | {cells} |')
    return lines
