# MILA-S: 43M params, 7.3G MACs, 84.4 top-1 (paper).
_base_ = './mila-t_16xb64_in1k.py'

model = dict(backbone=dict(arch='s', drop_path_rate=0.3))
