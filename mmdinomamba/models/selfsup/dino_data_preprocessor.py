"""The data preprocessor of the DINO configs: mmpretrain's, without host-device waits."""
from mmpretrain.models.utils import SelfSupDataPreprocessor
from mmpretrain.registry import MODELS

__all__ = ['DINODataPreprocessor']


@MODELS.register_module()
class DINODataPreprocessor(SelfSupDataPreprocessor):
    """:class:`mmpretrain.models.utils.SelfSupDataPreprocessor` for the multi-crop views, with
    the same output bit for bit and no host-device wait:

    * the crops are copied to the device with ``non_blocking=True`` (by default; from the
      pinned memory of ``pin_memory=True`` loaders the copy overlaps the host's work);
    * the BGR -> RGB swap of 3-channel views is ``flip(1)``, where mmpretrain indexes with the
      Python list ``[2, 1, 0]``, which makes an index tensor on the host and copies it to the
      device on every call.

    Args: as :class:`SelfSupDataPreprocessor`; ``non_blocking`` defaults to True.
    """

    def __init__(self, *args, non_blocking: bool = True, **kwargs):
        super().__init__(*args, non_blocking=non_blocking, **kwargs)

    def forward(self, data: dict, training: bool = False) -> dict:
        inputs = data.get('inputs') if isinstance(data, dict) else None
        if not isinstance(inputs, (list, tuple)) or any(
                getattr(x, 'dim', lambda: 0)() != 4 or x.shape[1] != 3 for x in inputs):
            return super().forward(data, training)
        batch_inputs, data_samples = self.cast_data([data['inputs'], data.get('data_samples')])
        if self._channel_conversion:
            batch_inputs = [x.flip(1) for x in batch_inputs]
        batch_inputs = [x.float() for x in batch_inputs]
        if self._enable_normalize:
            batch_inputs = [(x - self.mean) / self.std for x in batch_inputs]
        return {'inputs': batch_inputs, 'data_samples': data_samples}
