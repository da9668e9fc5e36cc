# ImageNet-R(endition) (Hendrycks et al., ICCV 2021), 30,000 renditions of 200 classes.
# Labels are ImageNet-1k indices; the accuracy restricts the 1000-way prediction to the 200
# classes (RestrictedAccuracy; the wnid list is in mmdinomamba/datasets/imagenet_wnids.py).
# Expected layout (the released archive): data/imagenet-r/n01443537/<image>.jpg ...
#   (200 wnid folders; README.txt beside them is ignored)
_base_ = ['./imagenet-v2-mf_probe_test.py']
test_dataloader = dict(
    dataset=dict(data_root='data/imagenet-r', folder_names='wnid', subset='imagenet-r'))
test_evaluator = dict(_delete_=True, type='RestrictedAccuracy', subset='imagenet-r', topk=(1, 5))
