# ImageNet-Sketch (Wang et al., NeurIPS 2019), 50,889 sketches of the 1000 ImageNet classes.
# Expected layout (the released archive unpacks to sketch/<wnid>/):
#   data/imagenet-sketch/sketch/n01440764/<image>.JPEG ...   (1000 wnid folders)
_base_ = ['./imagenet-v2-mf_probe_test.py']
test_dataloader = dict(
    dataset=dict(data_root='data/imagenet-sketch/sketch', folder_names='wnid'))
