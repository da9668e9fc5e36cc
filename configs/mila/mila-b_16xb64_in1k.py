# MILA-B: 96M params, 16.2G MACs, 85.3 top-1 (paper).
_base_ = './mila-t_16xb64_in1k.py'

model = dict(backbone=dict(arch='b', drop_path_rate=0.5), head=dict(in_channels=768))
