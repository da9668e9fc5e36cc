# ImageNet-V2 top-images (Recht et al., 2019), 10k images; see imagenet-v2-mf_probe_test.py.
# Expected layout: data/imagenetv2-top-images-format-val/<0..999>/<hash>.jpeg
_base_ = ['./imagenet-v2-mf_probe_test.py']
test_dataloader = dict(dataset=dict(data_root='data/imagenetv2-top-images-format-val'))
