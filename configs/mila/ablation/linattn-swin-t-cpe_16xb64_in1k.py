# Positional encoding instead of the forget gate (Table 2): CPE (28M, 4.5G, 81.7).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(cpe=True))
