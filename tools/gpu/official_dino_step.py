"""The official Dino-Mamba DINO step (``main_dino_vim.train_one_epoch``'s body), built from the
official code where it is present, for ``bench_official.py --dino``.

What one step does there, in order: bf16 autocast; the teacher on the 2 global crops and the
student on all crops through ``utils.MultiCropWrapper`` with ``DINOHead``; ``DINOLoss``
(center update inside); ``math.isfinite(loss.item())``; ``GradScaler`` scale / backward /
unscale; ``utils.clip_gradients`` (a ``.item()`` per parameter); ``utils.
cancel_gradients_last_layer``; the scaler's step and update; the per-parameter EMA loop of the
teacher; ``torch.cuda.synchronize()`` and ``loss.item()`` for the metric logger. The data loader
and the schedules' Python work are not part of it (nor of ours).
"""
import importlib
import os.path as osp
import sys

import torch

NEEDED = ('main_dino_vim.py', 'utils.py', 'models_vim.py')


def missing_files(repo: str) -> list:
    """The files of the official repository that the DINO step needs and ``repo`` lacks
    (``vision_transformer.py`` with ``DINOHead`` comes from facebookresearch/dino and may be
    absent too)."""
    names = list(NEEDED) + ['vision_transformer.py']
    return [n for n in names if not osp.isfile(osp.join(repo, n))]


def build_official_dino_step(repo: str, arch_fn: str, batch: int, res: int, local_res: int,
                             local_crops: int, out_dim: int = 65536, epoch: int = 1):
    """``(step, params)``: ``step()`` runs one official DINO iteration on fixed random crops
    (already on the GPU, as after the official ``im.cuda(non_blocking=True)``); ``epoch >= 1``
    trains the last layer (the first epoch freezes it)."""
    lost = missing_files(repo)
    if lost:
        raise FileNotFoundError(f'official DINO step: {repo} lacks {", ".join(lost)}')
    sys.path.insert(0, osp.abspath(repo))
    main = importlib.import_module('main_dino_vim')  # imports utils, vision_transformer
    utils, vits = importlib.import_module('utils'), importlib.import_module('vision_transformer')
    vims = importlib.import_module('models_vim')
    import math
    student_bb = getattr(vims, arch_fn)(drop_path_rate=0.1)
    teacher_bb = getattr(vims, arch_fn)()
    dim = student_bb.embed_dim
    student = utils.MultiCropWrapper(student_bb, vits.DINOHead(dim, out_dim)).cuda()
    teacher = utils.MultiCropWrapper(teacher_bb, vits.DINOHead(dim, out_dim)).cuda()
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    ncrops = 2 + local_crops
    loss_fn = main.DINOLoss(out_dim, ncrops, 0.04, 0.04, 0, 100).cuda()
    optimizer = torch.optim.AdamW(utils.get_params_groups(student), lr=1e-6)
    scaler = torch.cuda.amp.GradScaler()
    images = [torch.randn(batch, 3, res, res, device='cuda') for _ in range(2)] + [
        torch.randn(batch, 3, local_res, local_res, device='cuda') for _ in range(local_crops)]
    m = 0.996

    def step() -> float:
        with torch.autocast('cuda', dtype=torch.bfloat16):
            teacher_out = teacher(images[:2])
            student_out = student(images)
            loss = loss_fn(student_out, teacher_out, epoch)
        if not math.isfinite(loss.item()):
            raise RuntimeError(f'official DINO step: loss is {loss.item()}')
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        utils.clip_gradients(student, 3.0)
        utils.cancel_gradients_last_layer(epoch, student, 1)
        scaler.step(optimizer)
        scaler.update()
        with torch.no_grad():
            for q, k in zip(student.parameters(), teacher.parameters()):
                k.data.mul_(m).add_((1 - m) * q.detach().data)
        torch.cuda.synchronize()
        return loss.item()

    return step, sum(p.numel() for p in student_bb.parameters())
