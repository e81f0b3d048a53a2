"""Image folders (one sub-folder of images per class): files listed and checked, a seeded
held-out split per class, decoding and resizing in the pipeline."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import os

import numpy as np
import tensorflow as tf

from elastictrainer.errors import UserError, one_line
from elastictrainer.data import IMAGE_EXTENSIONS
from elastictrainer.data.pipeline import DatasetBundle, batch, resize, shuffle

HELD_OUT_FRACTION = 0.2
# Test splits of image folders whose resized float32 images fit in this many bytes stay in memory.
CACHE_BUDGET_BYTES = 256 * 2**20


def _list_images(folder):
    """Image files under `folder` (recursively, hidden entries skipped), sorted."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, f) for f in files
                     if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS))
    return sorted(found)


# What tf.io.decode_image recognises, by the first bytes of the file (it ignores extensions).
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")


def _is_image(path):
    try:
        with open(path, "rb") as f:
            return f.read(8).startswith(_IMAGE_MAGIC)
    except OSError:
        return False


def _drop_non_images(split):
    """{class: files} without the files TensorFlow could not decode, and those files."""
    kept, skipped = {}, []
    for name, files in split.items():
        good = [f for f in files if _is_image(f)]
        skipped += sorted(set(files) - set(good))
        if good:
            kept[name] = good
    return kept, skipped


def first_undecodable(files):
    """The first of `files` that TensorFlow cannot decode, with why; (None, None) if none.

    Called after a run stopped on a decode error, to name the file: a header can look right
    while the data is truncated, which only a full decode finds."""
    for path in files:
        try:
            tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        except tf.errors.OpError as e:
            return path, one_line(e.message.split("}}")[-1], 200)
    return None, None


def _class_folders(folder):
    """{class name: sorted image paths} for each non-hidden sub-folder holding images."""
    classes = {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.startswith(".") or not os.path.isdir(path):
            continue
        images = _list_images(path)
        if images:
            classes[entry] = images
    return classes


def _held_out_split(classes, seed):
    """Per class: 20% of the files (>= 1 when the class has >= 2) to test, chosen under the seed."""
    rng = np.random.default_rng(seed)
    train, test = {}, {}
    for name in sorted(classes):
        files = sorted(classes[name])
        n = len(files)
        k = 0 if n < 2 else max(1, int(round(HELD_OUT_FRACTION * n)))
        chosen = set(rng.permutation(n)[:k].tolist())
        test[name] = [f for i, f in enumerate(files) if i in chosen]
        train[name] = [f for i, f in enumerate(files) if i not in chosen]
    return train, test


def image_folder_dataset(path, input_size=224, batch_size=4, seed=0, shuffle_buffer=1000):
    """Dataset from PATH/<class>/<images> or PATH/{train,test}/<class>/<images>."""
    folder = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.exists(folder):
        raise UserError(f"dataset folder {path!r} does not exist")
    if not os.path.isdir(folder):
        raise UserError(f"dataset path {path!r} is not a directory")
    layout_hint = ("expected DIR/<class>/<image> or DIR/train/<class>/<image> + "
                   "DIR/test/<class>/<image>")
    tr_dir, te_dir = os.path.join(folder, "train"), os.path.join(folder, "test")
    # A file with an image extension that is not an image (empty, truncated header, another
    # format) would stop training part-way through an epoch: leave it out now, and say so.
    if os.path.isdir(tr_dir) and os.path.isdir(te_dir):
        (train, skip_train), (test, skip_test) = (_drop_non_images(_class_folders(d))
                                                  for d in (tr_dir, te_dir))
        skipped = skip_train + skip_test
        if not train or not test:
            empty = tr_dir if not train else te_dir
            raise UserError(f"no class sub-folders with images ({', '.join(IMAGE_EXTENSIONS)}) "
                            f"in {empty}; {layout_hint}")
    else:
        classes, skipped = _drop_non_images(_class_folders(folder))
        if not classes:
            raise UserError(f"no class sub-folders with images ({', '.join(IMAGE_EXTENSIONS)}) "
                            f"in {folder}; {layout_hint}")
        train, test = _held_out_split(classes, seed)
    class_names = tuple(sorted(set(train) | set(test)))
    if len(class_names) < 2:
        raise UserError(f"{folder} has {len(class_names)} class folder(s) with images "
                        f"({', '.join(class_names) or 'none'}); a classifier needs at least two")
    index = {c: i for i, c in enumerate(class_names)}

    def flatten(split):
        pairs = [(f, index[c]) for c in sorted(split) for f in split[c]]
        return [p for p, _ in pairs], np.array([label for _, label in pairs], dtype=np.int32)

    tr_files, tr_labels = flatten(train)
    te_files, te_labels = flatten(test)
    if not tr_files:
        raise UserError(f"no training images in {folder}: every class has a single image")

    def load(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return resize(image, input_size), label

    train_ds = tf.data.Dataset.from_tensor_slices((tf.constant(tr_files, tf.string), tr_labels))
    train_ds = shuffle(train_ds, len(tr_files) if shuffle_buffer > 0 else 0, seed)
    train_ds = train_ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test_ds = tf.data.Dataset.from_tensor_slices(
        (tf.constant(te_files, tf.string), te_labels.reshape(-1)))
    test_ds = test_ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if len(te_files) * input_size * input_size * 3 * 4 <= CACHE_BUDGET_BYTES:
        test_ds = test_ds.cache()
    return DatasetBundle(train=batch(train_ds, batch_size), test=batch(test_ds, 2 * batch_size),
                         num_classes=len(class_names), num_train=len(tr_files),
                         num_test=len(te_files), name=os.path.basename(folder) or folder,
                         class_names=class_names, skipped=tuple(skipped),
                         files=tuple(tr_files + te_files))


# ----------------------------------------------------------------------------- synthetic
