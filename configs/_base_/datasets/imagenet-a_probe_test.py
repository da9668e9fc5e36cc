# ImageNet-A (Hendrycks et al., CVPR 2021), 7,500 natural adversarial images of 200 classes.
# Labels are ImageNet-1k indices; the accuracy restricts the 1000-way prediction to the 200
# classes (RestrictedAccuracy; the wnid list is in mmdinomamba/datasets/imagenet_wnids.py).
# Expected layout (the released archive): data/imagenet-a/n01498041/<image>.jpg ...
#   (200 wnid folders; README.txt beside them is ignored)
_base_ = ['./imagenet-v2-mf_probe_test.py']
test_dataloader = dict(
    dataset=dict(data_root='data/imagenet-a', folder_names='wnid', subset='imagenet-a'))
test_evaluator = dict(_delete_=True, type='RestrictedAccuracy', subset='imagenet-a', topk=(1, 5))
