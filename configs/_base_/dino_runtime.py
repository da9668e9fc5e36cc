# Runtime shared by the DINO pretraining configs: mmpretrain's default runtime + the DINO hooks.
# DINOTeacherHook drives the schedules (model.set_progress) and the teacher EMA update;
# DINOCollapseMonitorHook stops on NaN/inf loss or a collapsed teacher; EpochSeedHook re-seeds
# every epoch so that --resume repeats the uninterrupted run. AtomicCheckpointHook writes each
# checkpoint to a scratch file and renames it into place before removing old ones (kill-safe).
# DINORuntimeInfoHook (for mmengine's RuntimeInfoHook) and the collapse monitor read the logged
# device scalars at the logging interval, not every iteration: the step has no host-device wait.
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
default_scope = 'mmpretrain'
default_hooks = dict(
    runtime_info=dict(type='DINORuntimeInfoHook'),
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=3, save_last=True))
custom_hooks = [
    dict(type='DINOTeacherHook'),
    dict(type='DINOCollapseMonitorHook', patience=500),
    dict(type='EpochSeedHook'),
]
# The head's last layer gets no gradient while frozen (first epoch): DDP must allow that.
model_wrapper_cfg = dict(type='MMDistributedDataParallel', find_unused_parameters=True)
randomness = dict(seed=0, diff_rank_seed=False, deterministic=False)
