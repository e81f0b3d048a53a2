"""`--dataset_name synthetic_textures`: a texture classification task, offline, in the manner
of a texture dataset (DTD, say): 40 classes of procedural textures, each one of ten families
(stripes, checks, spots, a grid of lines, rings, wavy stripes, zigzags, cells, clouds, bricks)
at one of four scales.

Every image is one texture filling the frame: the family's pattern at its class's scale
(cycles per image width, jittered per image), turned by a random angle and shifted by a random
phase, drawn in two random colours with a random sharpness of its edges, then a random
brightness and pixel noise.  So colour tells nothing of the class; the family does, and which
of the four scales it has.  An ImageNet backbone's frozen features tell texture families apart
well (textures are what such features encode best), the scales less so: training the backbone
adds the rest.

Calibration, as synthetic_objects' (data/objects.py): ImageNet EfficientNet-Lite0 at 96 px,
SGD 0.01 with momentum 0.9, batch 8, 8 epochs; full fine-tuning's best test accuracy (main.py
--train_type full_training), traditional TL's with the frozen layers' BatchNorm on moving
statistics (--bn_mode frozen), BN+Bias's, and a linear probe of the frozen features
(scikit-learn's logistic regression); 4096 test images unless said:

    scales (jitter, noise)           train  full   TL     TL/full  BN+Bias  probe
    3.0 4.4 6.4 9.4 (0.12, 0.06)     2000   95.8%  83.1%  0.87              87.0% (1024 test)
    3.6 4.7 6.1 8.0 (0.10, 0.10)     2000   94.7%  73.4%  0.78              77.3% (1024 test)
    3.6 4.7 6.1 8.0 (0.10, 0.10)     1200   87.6%  68.4%  0.78
    3.6 4.7 6.1 8.0 (0.10, 0.15)     2000   91.2%  71.2%  0.78
    4.0 4.8 5.8 7.0 (0.08, 0.10)     1500   79.6%  59.9%  0.75     50.2%     (kept)

Fewer images or more noise lower both alike; closer scales lower the head alone more.  With
the settings kept full fine-tuning is far from saturated and climbs for seven epochs (31, 49,
63, 69, 69, 77, 80, 80%) in 144 s of training on 2 cores; the head alone reaches 0.75 of it
(the paper's Fig. 17: 43 of 69, 0.62).  BN+Bias ends under the head alone: its BatchNorm layers
train on batch statistics of 8 images, where the head alone keeps the moving ones (the paper's
BN+Bias lies between the two).  `protocols.IMAGENET_OFFLINE` is this calibration's setting.

What the lower stages bring, on three settings (seed 0, --bn_mode frozen; last stage: blocks
6-7 and the head by hand, tensors 99-; rho 0.4: ElasticTrainer, whose selections reached down
to tensor 72, 63 on the kept setting):

    scales (jitter, noise)           train  full   TL     last stage  rho 0.4
    3.6 4.7 6.1 8.0 (0.08, 0.10)     1200   92.6%  70.3%  82.9%       84.1%
    4.0 4.8 5.8 7.0 (0.08, 0.00)     1500   85.1%  63.1%  76.7%       76.4%
    4.0 4.8 5.8 7.0 (0.08, 0.10)     1500   82.3%  59.8%  71.2%       73.2%  (kept: 3 seeds)

Wider scales and no noise make every scheme more accurate; the points between full
fine-tuning and the upper stages (8 to 11) stay.

Example i of (seed, split) is a function of (seed, split, i) only; labels are balanced and
permuted under (seed, split), as the `synthetic` dataset's (synthetic.py, whose pipeline this
one shares: a split that fits in memory is generated once and kept).
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import numpy as np
import tensorflow as tf

from elastictrainer.data import NUM_CLASSES, SYNTHETIC_EXAMPLES
from elastictrainer.data.synthetic import generated_bundle, generated_frame
from elastictrainer.errors import UserError

NAME = "synthetic_textures"
FAMILIES = ("stripes", "checks", "spots", "grid", "rings", "waves", "zigzag", "cells", "clouds",
            "bricks")
SCALES = (4.0, 4.8, 5.8, 7.0)  # cycles per image width of each class's scale
SCALE_JITTER = 0.08  # per image, a fraction of the scale either way
NOISE = 0.1  # std of additive pixel noise, in units of full scale
CELLS = 96  # random points of the cells family, of which scale^2 are used


def texture_source(input_size, num_examples, num_classes, seed, split):
    """(dataset of (index, label), generator (index, label) -> (image [S,S,3] in [0, 255],
    label)), as synthetic._synthetic_source gives them."""
    input_size = int(input_size)
    indices, xx, yy, key_of = generated_frame(input_size, num_examples, num_classes, seed, split,
                                              stream=11)
    scales = tf.constant(SCALES, tf.float32)
    two_pi = 2 * np.pi

    def cells(f, key):
        # Voronoi cell walls: where the nearest and second-nearest points are about as near
        points = tf.random.stateless_uniform([CELLS, 2], key, -0.5, 0.5)
        used = tf.range(CELLS, dtype=tf.float32) < tf.maximum(f * f, 4.0)
        d = tf.sqrt((xx[..., None] - points[:, 0]) ** 2 + (yy[..., None] - points[:, 1]) ** 2)
        d = tf.where(used, d, 10.0)
        nearest = -tf.math.top_k(-d, k=2).values
        return 1.0 - 4.0 * f * (nearest[..., 1] - nearest[..., 0])

    def clouds(f, key):
        # random plane waves in four octaves (half an octave apart), amplitude falling with
        # frequency: blobs about the scale's size
        w = tf.random.stateless_uniform([4, 3, 2], key)
        field = 0.0
        for octave in range(4):
            step = 2 ** (octave / 2)
            for k in range(3):
                angle, phase = np.pi * w[octave, k, 0], two_pi * w[octave, k, 1]
                along = xx * tf.cos(angle) + yy * tf.sin(angle)
                field += tf.sin(two_pi * f * step * 0.6 * along + phase) / step
        return field

    def pattern(family, u, v, r, f, key):
        """The family's field at scale f (positive where the first colour goes)."""
        fields = [
            tf.sin(two_pi * f * u),  # stripes
            tf.sin(two_pi * f * u) * tf.sin(two_pi * f * v),  # checks
            tf.cos(two_pi * f * u) + tf.cos(two_pi * f * v) - 1.0,  # spots
            tf.maximum(tf.cos(two_pi * f * u), tf.cos(two_pi * f * v)) - 0.8,  # grid
            tf.sin(two_pi * f * r),  # rings
            tf.sin(two_pi * f * u + 2.0 * tf.sin(two_pi * f / 3 * v)),  # waves
            tf.sin(two_pi * f * u + 4.0 * tf.abs(tf.sin(np.pi * f * v))),  # zigzag
            cells(f, key),  # cells
            clouds(f, key),  # clouds
            # bricks: rows of mortar, each row's joints half a brick from the last's
            tf.minimum(tf.abs(tf.sin(two_pi * f * v)),
                       tf.abs(tf.sin(np.pi * (f * u + 0.5 * tf.floor(2 * f * v))))) - 0.25,
        ]
        return tf.switch_case(family, [lambda field=field: field for field in fields])

    def colours(key):
        # two random hues, one colour light and one dark, so that the pattern always shows
        u = tf.random.stateless_uniform([2, 3], key)
        light = tf.image.hsv_to_rgb(tf.stack([u[0, 0], 0.3 + 0.7 * u[0, 1], 0.6 + 0.4 * u[0, 2]]))
        dark = tf.image.hsv_to_rgb(tf.stack([u[1, 0], 0.3 + 0.7 * u[1, 1], 0.1 + 0.3 * u[1, 2]]))
        return light, dark

    def make(index, label):
        keys = tf.random.experimental.stateless_split(key_of(index), num=6)
        family, level = label // len(SCALES), label % len(SCALES)
        pose = tf.random.stateless_uniform([7], keys[0])
        f = tf.gather(scales, level) * (1.0 + SCALE_JITTER * (2 * pose[0] - 1))
        angle = np.pi * pose[1]
        x0, y0 = pose[2] - 0.5, pose[3] - 0.5  # the phase: the pattern's origin
        u = (xx - x0) * tf.cos(angle) + (yy - y0) * tf.sin(angle)
        v = -(xx - x0) * tf.sin(angle) + (yy - y0) * tf.cos(angle)
        r = tf.sqrt((xx - x0 * 0.6) ** 2 + (yy - y0 * 0.6) ** 2)
        field = pattern(family, u, v, r, f, keys[1])
        sharp = 2.0 + 10.0 * pose[4]  # soft edges to hard ones
        mask = tf.sigmoid(sharp * field)[..., None]
        light, dark = colours(keys[2])
        first = pose[6] < 0.5  # which of the two goes where the field is positive
        image = tf.where(first, mask * light + (1 - mask) * dark, mask * dark + (1 - mask) * light)
        image = image * (0.75 + 0.4 * pose[5])
        image += NOISE * tf.random.stateless_normal([input_size, input_size, 3], keys[4])
        return tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), label

    return indices, make


def textures_dataset(input_size=224, num_classes=NUM_CLASSES[NAME], num_train=SYNTHETIC_EXAMPLES,
                     num_test=SYNTHETIC_EXAMPLES, seed=0, batch_size=4, shuffle_buffer=1000):
    """The built-in 'synthetic_textures' dataset as a DatasetBundle."""
    classes = len(FAMILIES) * len(SCALES)
    if int(num_classes) != classes:
        raise UserError(f"{NAME} has {classes} classes ({len(FAMILIES)} texture families at "
                        f"{len(SCALES)} scales), got --num_classes {num_classes}")
    return generated_bundle(NAME, texture_source, input_size, num_classes, num_train, num_test,
                            seed, batch_size, shuffle_buffer)
