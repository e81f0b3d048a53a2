"""The built-in synthetic dataset (offline, generated per seed) and the synthetic source task
that `--weights synthetic` pretrains on, with classes disjoint from the dataset's."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import numpy as np
import tensorflow as tf

from elastictrainer.errors import UserError
from elastictrainer.data import NUM_CLASSES, SYNTHETIC_EXAMPLES
from elastictrainer.data.pipeline import LOADERS, DatasetBundle, batch, positive_int, shuffle

# Grating frequencies in cycles per image width, so a class looks the same at every input size.
_SYN_FREQUENCIES = (2.5, 5.5, 9.0)
_SYN_NOISE = 0.12  # std of additive pixel noise, in units of full scale


def _synthetic_class_params(num_classes):
    """Per class: grating orientation (radians), frequency (cycles/image) and an RGB tint."""
    n_freq = 1 if num_classes <= 4 else (2 if num_classes <= 12 else 3)
    n_orient = -(-num_classes // n_freq)
    c = np.arange(num_classes)
    orient = (c % n_orient) * np.pi / n_orient
    freq = np.array(_SYN_FREQUENCIES)[c // n_orient]
    return orient.astype(np.float32), freq.astype(np.float32), _tints(c, num_classes)


def _tints(c, num_classes, offset=0.0):
    hue = 2 * np.pi * (c + offset) / num_classes
    return (0.5 + 0.5 * np.stack([np.cos(hue), np.cos(hue - 2 * np.pi / 3),
                                  np.cos(hue + 2 * np.pi / 3)], axis=1)).astype(np.float32)


# The source task of `--weights synthetic` (models/pretrain.py): the same generator, other classes.
# Its frequencies sit outside the target's bands (_SYN_FREQUENCIES +-10% jitter), so no source
# image has a frequency any target class can draw, whatever the target's class count: the
# classes are disjoint, the image statistics are shared.  Why these: the source must leave its
# backbone's early stages general and its last stage specific, as ImageNet does for the paper's
# fine-tuning tasks.  Measured with the 32-48-64 smallcnn at 64 px (the smallcnn setting: 12 epochs,
# 4800 target images, batch 32, Adam 1e-3, 1024 test images; seeds 0-4), best test accuracy
# under full training's: with 6 orientations (18 classes, 15 degrees apart from the target's
# nearest) the last stage plus the head, trained fixed, ended 3.8 points under on average and
# ElasticTrainer 3.5; with 12 orientations (36 classes, 7.5 degrees apart, closer than the
# generator's +-8 degree jitter, so the early stages must resolve orientation finely) the
# same fixed selection ended 0.2 under and the head alone 15.8 under.
SOURCE_FREQUENCIES = (1.8, 4.3, 11.5)
SOURCE_ORIENTATIONS = 12
SOURCE_NUM_CLASSES = SOURCE_ORIENTATIONS * len(SOURCE_FREQUENCIES)
SYN_FREQUENCY_JITTER = 0.1  # f = class frequency x [0.9, 1.1] in the generator


def synthetic_source_class_params():
    """Per source class: orientation (half a step off the SOURCE_ORIENTATIONS-way grid),
    frequency and tint."""
    c = np.arange(SOURCE_NUM_CLASSES)
    orient = (c % SOURCE_ORIENTATIONS + 0.5) * np.pi / SOURCE_ORIENTATIONS
    freq = np.array(SOURCE_FREQUENCIES)[c // SOURCE_ORIENTATIONS]
    return (orient.astype(np.float32), freq.astype(np.float32),
            _tints(c, SOURCE_NUM_CLASSES, offset=0.5))


def synthetic_examples(input_size, num_examples, num_classes=NUM_CLASSES["synthetic"], seed=0,
                       split=0):
    """Unbatched, unshuffled tf.data.Dataset of (image float32 [S,S,3] in [0,255], label int32).

    split: 0 for train, 1 for test (independent streams).
    Example i of (seed, split) is a function of (seed, split, i) only: a Gabor patch (class
    orientation and frequency, random phase, position, size, contrast and small orientation and
    frequency jitter) over a brightness-scaled background, tinted with a noisy class colour, plus
    pixel noise. Labels are balanced and permuted under (seed, split).
    """
    indices, make = _synthetic_source(input_size, num_examples, num_classes, seed, split)
    return indices.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def generated_frame(input_size, num_examples, num_classes, seed, split, stream=0):
    """What every generated dataset's source starts from: (dataset of (index, label) with the
    labels balanced and permuted under (seed, split), the pixel centres' coordinates (xx, yy)
    [S, S] in (-0.5, 0.5), key_of(index): example index's random key).  `stream` keeps one
    dataset's draws apart from another's on the same (seed, split): 0 the `synthetic` set's."""
    input_size, num_examples = int(input_size), int(num_examples)
    rng = [int(seed) & 0xFFFFFFFF, int(split)] + ([int(stream)] if stream else [])
    labels = np.random.default_rng(rng).permutation(
        np.arange(num_examples) % int(num_classes)).astype(np.int32)
    coords = (np.arange(input_size, dtype=np.float32) + 0.5) / input_size - 0.5
    yy, xx = (tf.constant(a) for a in np.meshgrid(coords, coords, indexing="ij"))
    base = tf.constant([int(seed), (int(split) << 40) | (int(stream) << 32)], tf.int64)

    def key_of(index):
        return base + tf.stack([tf.constant(0, tf.int64), index])

    indices = tf.data.Dataset.from_tensor_slices((tf.range(num_examples, dtype=tf.int64), labels))
    return indices, xx, yy, key_of


def _synthetic_source(input_size, num_examples, num_classes, seed, split, params=None):
    """(dataset of (index, label), generator fn (index, label) -> (image, label)).

    Callers shuffle the cheap (index, label) dataset, then map the generator over it.
    params: the classes' (orientation, frequency, tint) arrays; default
    _synthetic_class_params(num_classes), the `synthetic` dataset's.
    """
    input_size, num_classes = int(input_size), int(num_classes)
    indices, xx, yy, key_of = generated_frame(input_size, num_examples, num_classes, seed, split)
    if params is None:
        params = _synthetic_class_params(num_classes)
    orient, freq, tint = (tf.constant(a) for a in params)

    def make(index, label):
        keys = tf.random.experimental.stateless_split(key_of(index), num=3)
        u = tf.random.stateless_uniform([9], keys[0])
        theta = tf.gather(orient, label) + (u[0] - 0.5) * (np.pi / 11)  # about +-8 degrees
        f = tf.gather(freq, label) * (1 - SYN_FREQUENCY_JITTER + 2 * SYN_FREQUENCY_JITTER * u[1])
        phase = 2 * np.pi * u[2]
        cx, cy = 0.4 * (u[3] - 0.5), 0.4 * (u[4] - 0.5)
        sigma = 0.15 + 0.2 * u[5]
        contrast = 0.35 + 0.65 * u[6]
        brightness = 0.6 + 0.5 * u[7]
        tint_strength = 0.15 + 0.3 * u[8]
        along = xx * tf.cos(theta) + yy * tf.sin(theta)
        grating = tf.sin(2 * np.pi * f * along + phase)
        envelope = tf.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma ** 2))
        luminance = 0.5 + 0.5 * contrast * grating * envelope  # [S, S] in [0, 1]
        colour = tf.gather(tint, label) + 0.5 * (tf.random.stateless_uniform([3], keys[1]) - 0.5)
        colour = (1 - tint_strength) + tint_strength * colour  # [3]
        image = luminance[..., None] * colour * brightness
        image += _SYN_NOISE * tf.random.stateless_normal([input_size, input_size, 3], keys[2])
        # 8-bit levels, as a photo's: so a set kept in memory as uint8 is the same set
        return tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), label

    return indices, make


# A split up to this size (as 8-bit pixels) is generated once and kept in memory: drawing an
# image costs more CPU than decoding a JPEG, and on a 2-core device that work would take the
# cores from training for the whole run (smallcnn at 64 px, batch 32: 6.7 ms of generation per
# 40 ms step), and from every epoch's test (4096 test images at 96 px: about 3 s an epoch).
# Larger splits are generated batch by batch, as they are drawn.
SYN_MEMORY_BYTES = 128 * 2**20


def _kept_if_small(indices, make, num_examples, input_size):
    """`make`, answered from memory (_generated_once) when the split fits SYN_MEMORY_BYTES."""
    if num_examples * input_size * input_size * 3 <= SYN_MEMORY_BYTES:
        return _generated_once(indices, make)
    return make


def _generated_once(indices, make):
    """`make`, answered from a table of all its images made once (index i -> row i)."""
    rows = indices.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    table = tf.constant(np.concatenate([x.numpy().astype(np.uint8) for x, _ in rows.batch(256)]))

    def lookup(index, label):
        return tf.cast(tf.gather(table, index), tf.float32), label

    return lookup


def synthetic_dataset(input_size=224, num_classes=NUM_CLASSES["synthetic"],
                      num_train=SYNTHETIC_EXAMPLES, num_test=SYNTHETIC_EXAMPLES, seed=0,
                      batch_size=4, shuffle_buffer=1000):
    """The built-in 'synthetic' dataset (see synthetic_examples) as a DatasetBundle."""
    return generated_bundle("synthetic", _synthetic_source, input_size, num_classes, num_train,
                            num_test, seed, batch_size, shuffle_buffer)


def generated_bundle(name, source, input_size, num_classes, num_train, num_test, seed,
                     batch_size, shuffle_buffer):
    """A generated dataset as a DatasetBundle: `source(input_size, num_examples, num_classes,
    seed, split)` gives (dataset of (index, label), generator) per split; the train split is
    reshuffled every pass, a split that fits in memory is generated once."""
    input_size = positive_int(input_size, "input_size")
    num_classes = positive_int(num_classes, "num_classes")
    num_train = positive_int(num_train, "num_train")
    num_test = positive_int(num_test, "num_test")
    batch_size = positive_int(batch_size, "batch_size")
    if num_classes < 2:
        raise UserError(f"{name} data needs num_classes >= 2, got {num_classes}")
    train, make = source(input_size, num_train, num_classes, seed, 0)
    make = _kept_if_small(train, make, num_train, input_size)
    train = shuffle(train, num_train if shuffle_buffer > 0 else 0, seed)
    train = train.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test, make_test = source(input_size, num_test, num_classes, seed, 1)
    make_test = _kept_if_small(test, make_test, num_test, input_size)
    test = test.map(make_test, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return DatasetBundle(train=batch(train, batch_size), test=batch(test, 2 * batch_size),
                         num_classes=num_classes, num_train=num_train, num_test=num_test,
                         name=name,
                         class_names=tuple(f"class_{i}" for i in range(num_classes)))


LOADERS.register("synthetic")(synthetic_dataset)

SHIFTED_NAME = "synthetic_shifted"


def shifted_dataset(input_size=224, num_classes=NUM_CLASSES[SHIFTED_NAME],
                    num_train=SYNTHETIC_EXAMPLES, num_test=SYNTHETIC_EXAMPLES, seed=0,
                    batch_size=4, shuffle_buffer=1000):
    """`--dataset_name synthetic_shifted`: the `synthetic` dataset's examples seen through the
    fixed domain shift of data/domain_shift.py (DomainShift(): rotated 30 degrees, channels
    permuted and inverted, noise 0.2), the same shift whatever the run's seed.  A backbone
    pretrained on the synthetic source task (`--weights synthetic`) must then move the layers
    that see pixels, as the model.fit benchmark's domain_shift_fit does."""
    from elastictrainer.data.domain_shift import DomainShift, shift_image

    shift = DomainShift()

    def source(input_size, num_examples, num_classes, seed, split):
        indices, make = _synthetic_source(input_size, num_examples, num_classes, seed, split)

        def make_shifted(index, label):
            image, label = make(index, label)
            return shift_image(image, index, shift, split), label

        return indices, make_shifted

    return generated_bundle(SHIFTED_NAME, source, input_size, num_classes, num_train,
                            num_test, seed, batch_size, shuffle_buffer)


def synthetic_source_examples(input_size, num_examples, seed=0, split=0):
    """The source task of `--weights synthetic`: like synthetic_examples, but with the
    SOURCE_NUM_CLASSES classes of synthetic_source_class_params (disjoint from the `synthetic`
    dataset's) and its own random stream."""
    indices, make = _synthetic_source(input_size, num_examples, SOURCE_NUM_CLASSES, seed, split,
                                      params=synthetic_source_class_params())
    return indices.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
