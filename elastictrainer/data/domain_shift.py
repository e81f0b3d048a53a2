"""A fixed change of image domain, applied to a dataset's images: the same scene seen by another
camera.  The time-to-accuracy benchmark's domain_shift_fit configuration fine-tunes on images
shifted so, from a backbone pretrained on unshifted ones, so that a fine-tune has to move the
layers that see pixels, not only the last stage and the head.

Three changes, each a function of the shift's seed and the example's index alone (so a split
is the same set on every pass and in every process):
  * a rotation of the whole image by a fixed angle about its centre, corners filled black:
    every oriented edge the backbone's first filters learned turns by that angle;
  * colour: the channels permuted (a cyclic permutation the seed picks, never the identity)
    and the image inverted (255 - x): the first layer's colour and polarity responses no longer
    match what they were trained on;
  * additive Gaussian pixel noise of a fixed standard deviation, then clipped and rounded to
    8-bit levels, as a photo's.
Images are float32 [S, S, 3] in [0, 255], as every dataset of data/ gives them.  TensorFlow
is imported when a shift is applied, not with the module: a benchmark names its shift without
starting TensorFlow.
"""
import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class DomainShift:
    """The shift: rotation in degrees (counter-clockwise), whether colours are permuted and
    inverted, the noise's standard deviation in units of full scale, and the seed of the
    permutation and the noise."""
    rotation_deg: float = 30.0
    colour: bool = True
    noise: float = 0.2
    seed: int = 0

    def permutation(self):
        """The channel order: output channel c is input channel permutation()[c]; one of the
        two cyclic shifts, so no channel keeps its place."""
        shift = 1 + int(np.random.default_rng([int(self.seed) & 0xFFFFFFFF, 7]).integers(2))
        return [(c + shift) % 3 for c in range(3)]


def _rotation(angle_deg, size):
    """ImageProjectiveTransformV3's transform (output pixel -> input pixel) rotating a
    size x size image by angle_deg about its centre."""
    a = math.radians(angle_deg)
    c, s = math.cos(a), math.sin(a)
    centre = (size - 1) / 2.0
    # input = R^-1 (output - centre) + centre
    return [c, s, centre - c * centre - s * centre,
            -s, c, centre + s * centre - c * centre, 0.0, 0.0]


def shift_image(image, index, shift, split=0):
    """Example `index` of split `split`, shifted: a function of (shift, split, index, image)."""
    from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)
    import tensorflow as tf

    size = int(image.shape[0])
    x = image
    if shift.rotation_deg:
        x = tf.raw_ops.ImageProjectiveTransformV3(
            images=x[None], transforms=tf.constant([_rotation(shift.rotation_deg, size)],
                                                   tf.float32),
            output_shape=tf.constant([size, size], tf.int32), fill_value=0.0,
            interpolation="BILINEAR", fill_mode="CONSTANT")[0]
    if shift.colour:
        x = 255.0 - tf.gather(x, shift.permutation(), axis=-1)
    if shift.noise:
        key = tf.stack([tf.constant(int(shift.seed), tf.int64),
                        tf.constant(int(split) << 40, tf.int64) + tf.cast(index, tf.int64)])
        x += 255.0 * shift.noise * tf.random.stateless_normal(tf.shape(x), key)
    return tf.round(tf.clip_by_value(x, 0.0, 255.0))


def shifted(examples, shift, split=0):
    """An unbatched dataset of (image, label), its i-th image shifted as example i of `split`
    (shift_image); labels unchanged."""
    import tensorflow as tf

    def one(index, example):
        image, label = example
        return shift_image(image, index, shift, split), label

    return examples.enumerate().map(one, num_parallel_calls=tf.data.AUTOTUNE,
                                    deterministic=True)
