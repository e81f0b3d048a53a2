"""What every dataset loader shares: the bundle a load returns, the registry of named
datasets, and the pipeline steps (checking sizes, shuffling, batching, resizing)."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

from dataclasses import dataclass, field

import tensorflow as tf

from elastictrainer.errors import Registry, UserError

# Named datasets -> their loader (tfds_data.py and synthetic.py register theirs).
LOADERS = Registry("dataset")


@dataclass(frozen=True)
class DatasetBundle:
    train: tf.data.Dataset   # batches of batch_size, reshuffled every iteration under the seed
    test: tf.data.Dataset    # batches of 2 * batch_size, fixed order
    num_classes: int
    num_train: int
    num_test: int
    name: str
    class_names: tuple = field(default=())  # may be empty when the source does not name its classes
    skipped: tuple = field(default=())  # files left out because they are not images
    files: tuple = field(default=())    # image files read (folders), for naming a bad one


def positive_int(value, what):
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a positive integer, got {value!r}") from None
    if v < 1 or v != value:
        raise UserError(f"{what} must be a positive integer, got {value!r}")
    return v


def shuffle(ds, buffer, seed):
    if buffer <= 0:
        return ds
    return ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def batch(ds, batch_size):
    return ds.batch(batch_size, drop_remainder=False).prefetch(tf.data.AUTOTUNE)


def resize(image, input_size):
    """uint8 image of any size (H, W, 3) -> float32 (S, S, 3) in [0, 255], as the reference did."""
    image = tf.image.resize(image, (input_size, input_size))  # bilinear, returns float32
    return tf.clip_by_value(image, 0.0, 255.0)

