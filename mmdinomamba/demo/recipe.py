"""Settings of the demo's DINO recipe that depend on the data, derived from what can be measured.

:func:`measure_data` reads a sample of the train split; :func:`derive_settings` turns the
measurements into ``--cfg-options`` of the demo's pretraining config, each with its reason. The
demo applies them before the user's own ``--cfg-options`` (which win), and states both in its
report. The rules (measured runs: docs/dino_small_scale.md):

* **length**: the embedded recipe's 33,600 images seen (14 epochs of 2,400), whatever the size
  of the data: ``epochs = round(33600 / num_train)`` (at least 2, at most 60);
* **colour augmentation**: DINO's hue / saturation jitter, grayscale and solarization make the
  views' colours differ, which stops the network from matching views by colour alone; where the
  classes differ in colour it erases the class. Measured by the share of the variance of the
  images' mean chroma that lies between classes (eta squared, from the train labels that the
  evaluation reads as well): at or above :data:`COLOUR_CLASS_ETA2` the colour is kept (brightness
  / contrast jitter only); below, DINO's colour augmentation is used. Grayscale images (all
  channels equal) have no colour to jitter: brightness / contrast only;
* **crop scales**: on a plain background (most of an image one flat colour, measured as the
  share of pixels within 12 levels of the image's border median) a small local crop is often
  background only, identical for every image; local crops then start at 0.15 of the image and
  global crops at 0.5. On such data the backbone's features of different images are nearly the
  same from the start and DINO drives them to one point (the teacher's outputs carry no
  information about the image: uniform collapse), which crop scales, a lower lr, teacher
  temperature 0.02, EMA centering or a frozen last layer did not prevent in measured runs.
  The demo then sets two things: the KoLeo regularizer, which spreads the backbone features of
  a batch, at weight :data:`PLAIN_KOLEO` (alone it prevented the collapse in short runs only:
  at the derived length the teacher still went uniform, from iteration 80-250 with a teacher
  temperature of 0.04 or 0.02, a halved lr or a slower teacher), and a sharper teacher,
  temperature :data:`PLAIN_TEACHER_TEMP`: the images' teacher outputs differ little on such
  data, and at 0.04 the Sinkhorn-Knopp targets of nearly equal outputs are nearly uniform (our
  reading of the signals).
"""
import os.path as osp
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image

__all__ = ['measure_data', 'derive_settings', 'merge_options', 'kept_reasons',
           'COLOUR_CLASS_ETA2', 'PLAIN_BACKGROUND', 'PLAIN_KOLEO', 'PLAIN_TEACHER_TEMP']

#: images seen by the embedded recipe (14 epochs x 2,400 train images)
IMAGES_SEEN = 33600
#: classes differ in colour when this share of the mean-chroma variance is between classes
COLOUR_CLASS_ETA2 = 0.3
#: a plain background: this share of the pixels is the border colour
PLAIN_BACKGROUND = 0.5
#: KoLeo weight on data with a plain background (0 otherwise, as in the demo config)
PLAIN_KOLEO = 1.0
#: teacher temperature on data with a plain background (the demo config's 0.04 otherwise)
PLAIN_TEACHER_TEMP = 0.01
_GRAY_TOL = 3
_PIPE = 'train_dataloader.dataset.pipeline.1.'


def _rows(root: str, split: str = 'train'):
    with open(osp.join(root, 'meta', f'{split}.txt')) as f:
        return [line.rsplit(maxsplit=1) for line in f if line.strip()]


def measure_data(root: str, max_images: int = 400) -> Dict[str, float]:
    """Measure the train split of a data folder in the demo layout (an evenly spaced sample of
    at most ``max_images`` images).

    Returns:
        dict: ``num_train``, ``img_size`` (median shorter side, px), ``grayscale`` (share of
        images whose channels are equal), ``colourfulness`` (Hasler and Suesstrunk's, mean over
        images), ``colour_class_eta2`` (share of the variance of the images' mean chroma that
        lies between classes), ``plain_background`` (mean share of pixels within 12 levels of
        the image's border median colour).
    """
    rows = _rows(root)
    idx = np.unique(np.linspace(0, len(rows) - 1, min(max_images, len(rows))).astype(int))
    sides, gray, colourful, chroma, labels, plain = [], [], [], [], [], []
    for i in idx:
        rel, label = rows[i]
        img = np.asarray(Image.open(osp.join(root, 'train', rel)).convert('RGB'), np.float32)
        sides.append(min(img.shape[:2]))
        r, g, b = img[..., 0], img[..., 1], img[..., 2]
        gray.append(float(np.abs(r - g).max() <= _GRAY_TOL and np.abs(g - b).max() <= _GRAY_TOL))
        rg, yb = r - g, 0.5 * (r + g) - b
        colourful.append(float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(),
                                                                               yb.mean())))
        chroma.append((rg.mean(), yb.mean()))
        labels.append(int(label))
        border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
        plain.append(float((np.abs(img - np.median(border, 0)).max(-1) <= 12).mean()))
    return dict(num_train=len(rows), img_size=float(np.median(sides)),
                grayscale=float(np.mean(gray)), colourfulness=float(np.mean(colourful)),
                colour_class_eta2=_eta2(np.array(chroma), np.array(labels)),
                plain_background=float(np.mean(plain)))


def _eta2(x: np.ndarray, labels: np.ndarray) -> float:
    """Between-class share of the total variance of ``x`` (N, D), summed over D."""
    total = ((x - x.mean(0)) ** 2).sum()
    if total <= 0:
        return 0.
    between = sum((labels == c).sum() * ((x[labels == c].mean(0) - x.mean(0)) ** 2).sum()
                  for c in np.unique(labels))
    return float(between / total)


def derive_settings(m: Dict[str, float]) -> Tuple[dict, Dict[str, List[str]]]:
    """``--cfg-options`` of the demo's pretraining config for data with measurements ``m``
    (:func:`measure_data`), and the reasons (each with the option keys it sets).

    The embedded data (colour classes, cluttered background, 2,400 images) get the demo
    config's own settings back, so ``make demo`` is unchanged by these rules.
    """
    opts, why = {}, {}

    def add(reason: str, **kv):
        keys = [k.replace('__', '.') for k in kv]
        opts.update(zip(keys, kv.values()))
        why[reason] = keys

    epochs = int(min(60, max(2, round(IMAGES_SEEN / m['num_train']))))
    add(f'{epochs} epochs: {m["num_train"]:.0f} train images, {IMAGES_SEEN} images seen as in '
        'the embedded recipe', train_cfg__max_epochs=epochs, param_scheduler__1__end=epochs,
        param_scheduler__2__end=epochs)
    if m['grayscale'] >= 0.95:
        jitter, gray, sol = dict(brightness=0.4, contrast=0.4, saturation=0., hue=0.), 0., 0.
        reason = (f'grayscale images ({100 * m["grayscale"]:.0f}% with equal channels): '
                  'brightness / contrast jitter 0.4 only')
    elif m['colour_class_eta2'] >= COLOUR_CLASS_ETA2:
        jitter, gray, sol = dict(brightness=0.2, contrast=0.2, saturation=0., hue=0.), 0., 0.
        reason = (f'the classes differ in colour (eta^2 of mean chroma '
                  f'{m["colour_class_eta2"]:.2f} >= {COLOUR_CLASS_ETA2}): no hue / saturation '
                  'jitter, grayscale or solarization')
    else:
        jitter, gray = dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1), 0.2
        sol = 0.2
        reason = (f'colour images whose classes do not differ in colour (eta^2 of mean chroma '
                  f'{m["colour_class_eta2"]:.2f} < {COLOUR_CLASS_ETA2}): DINO\'s colour '
                  'augmentation (hue 0.1, saturation 0.2, grayscale 0.2, solarization 0.2)')
    add(reason, **{_PIPE.replace('.', '__') + k: v for k, v in (
        ('color_jitter', jitter), ('grayscale_prob', gray),
        ('global_solarize_probs', (0., sol)))})
    if m['plain_background'] >= PLAIN_BACKGROUND:
        add(f'plain background ({100 * m["plain_background"]:.0f}% of the pixels): crop scales '
            '0.5-1 (global) and 0.15-0.5 (local)',
            **{_PIPE.replace('.', '__') + 'global_crops_scale': (0.5, 1.),
               _PIPE.replace('.', '__') + 'local_crops_scale': (0.15, 0.5)})
        add(f'plain background: KoLeo {PLAIN_KOLEO} on the backbone features (without it the '
            'features of all images went to one point)', model__koleo_weight=PLAIN_KOLEO)
        add(f'plain background: teacher temperature {PLAIN_TEACHER_TEMP} (the images\' teacher '
            'outputs differ little; at 0.04 and 0.02 the teacher went uniform)',
            model__teacher_temp=PLAIN_TEACHER_TEMP, model__warmup_teacher_temp=PLAIN_TEACHER_TEMP)
    return opts, why


def kept_reasons(why: Dict[str, List[str]], kept: dict) -> List[str]:
    """The reasons of which at least one option was kept by :func:`merge_options`."""
    return [r for r, keys in why.items() if any(k in kept for k in keys)]


_LENGTH = ('train_cfg', 'param_scheduler')


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + '.') or b.startswith(a + '.')


def merge_options(derived: dict, user: dict) -> Tuple[dict, dict]:
    """``derived`` then ``user`` options: a derived key is dropped where a user key sets it (or
    a part of it, or a whole above it), and the derived length (epochs and the schedulers' end)
    as a whole where the user sets any ``train_cfg`` / ``param_scheduler`` key.

    Returns:
        tuple: the merged options and the derived options kept.
    """
    user = dict(user or {})
    touches_length = any(k.split('.')[0] in _LENGTH for k in user)
    kept = {k: v for k, v in derived.items()
            if not any(_overlaps(k, u) for u in user)
            and not (touches_length and k.split('.')[0] in _LENGTH)}
    return {**kept, **user}, kept
