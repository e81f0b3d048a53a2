"""The dataset loaders: TFDS, image folders and the built-in synthetic set, as batched tf.data
pipelines (see the package docstring for what each returns)."""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import os
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np
import tensorflow as tf

from elastictrainer.common import Registry, UserError, one_line
from elastictrainer.data import DATASET_NAMES, IMAGE_EXTENSIONS, NUM_CLASSES, TFDS_NAMES

HELD_OUT_FRACTION = 0.2
# Test splits of image folders whose resized float32 images fit in this many bytes stay in memory.
CACHE_BUDGET_BYTES = 256 * 2**20
# How long the "can we reach the download servers" check may take before we call it offline.
NETWORK_CHECK_SECONDS = 5.0

_LOADERS = Registry("dataset")


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


# ----------------------------------------------------------------------------- entry point

def load_dataset(name_or_path, input_size=224, batch_size=4, seed=0, data_dir=None,
                 shuffle_buffer=1000, download=True, **kwargs):
    """Load a dataset by name (DATASET_NAMES) or image-folder path into a DatasetBundle.

    A name in DATASET_NAMES wins over a same-named folder in the working directory (pass
    ./NAME for the folder).

    shuffle_buffer: TFDS train splits are shuffled through a buffer of this many (still encoded)
      images; folders and synthetic data shuffle whole file/index lists. 0 disables shuffling.
    download: for TFDS datasets not yet prepared in data_dir, try TFDS's download_and_prepare.
    kwargs: only for 'synthetic' (num_classes, num_train, num_test).
    """
    input_size = _positive_int(input_size, "input_size")
    batch_size = _positive_int(batch_size, "batch_size")
    if int(shuffle_buffer) < 0:
        raise UserError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
    seed = int(seed)
    opts = dict(input_size=input_size, batch_size=batch_size, seed=seed,
                shuffle_buffer=int(shuffle_buffer))
    key = os.fspath(name_or_path)

    if key == "synthetic":
        return synthetic_dataset(**opts, **kwargs)
    if kwargs:
        raise TypeError(f"unexpected arguments for dataset {key!r}: {', '.join(sorted(kwargs))}"
                        " (only 'synthetic' takes extra arguments)")
    if key in _LOADERS:
        return _LOADERS[key](key, data_dir=data_dir, download=download, **opts)
    looks_like_path = os.sep in key or key.startswith((".", "~")) or os.path.exists(key)
    if looks_like_path:
        return image_folder_dataset(key, **opts)
    raise UserError(f"unknown dataset {key!r}; valid: {', '.join(DATASET_NAMES)}"
                    " (or the path of an image folder with one sub-folder per class)")


def _positive_int(value, what):
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a positive integer, got {value!r}") from None
    if v < 1 or v != value:
        raise UserError(f"{what} must be a positive integer, got {value!r}")
    return v


def _shuffle(ds, buffer, seed):
    if buffer <= 0:
        return ds
    return ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _batch(ds, batch_size):
    return ds.batch(batch_size, drop_remainder=False).prefetch(tf.data.AUTOTUNE)


def _resize(image, input_size):
    """uint8 image of any size (H, W, 3) -> float32 (S, S, 3) in [0, 255], as the reference did."""
    image = tf.image.resize(image, (input_size, input_size))  # bilinear, returns float32
    return tf.clip_by_value(image, 0.0, 255.0)


# ----------------------------------------------------------------------------- TFDS

def _tfds_loader(name, *, input_size, batch_size, seed, shuffle_buffer, data_dir, download):
    import tensorflow_datasets as tfds

    data_dir = None if data_dir is None else os.path.expanduser(os.fspath(data_dir))
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # e.g. unreadable data_dir
        raise UserError(f"cannot open TFDS dataset {name!r} in {data_dir}: {one_line(e, 200)}"
                        ) from None
    if not builder.is_prepared():
        _prepare(builder, name, download)

    image_key, label_key = builder.info.supervised_keys
    label_feature = builder.info.features[label_key]
    num_classes = int(label_feature.num_classes)
    try:
        class_names = tuple(label_feature.names)
    except Exception:
        class_names = ()
    # Read only image and label (not masks, boxes...), and keep images encoded until after the
    # shuffle buffer, which then holds kilobytes per element instead of decoded pictures.
    decoders = tfds.decode.PartialDecoding({image_key: True, label_key: True},
                                           decoders={image_key: tfds.decode.SkipDecoding()})

    def split(split_name):
        ds = builder.as_dataset(split=split_name, as_supervised=True, decoders=decoders,
                                shuffle_files=False)
        n = int(ds.cardinality())
        if n < 0:
            n = int(builder.info.splits[split_name].num_examples)
        return ds, n

    def decode(encoded, label):
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        return _resize(image, input_size), tf.cast(label, tf.int32)

    train, n_train = split("train")
    test, n_test = split("test")
    train = _shuffle(train, shuffle_buffer, seed)
    train = train.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test = test.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return DatasetBundle(train=_batch(train, batch_size), test=_batch(test, 2 * batch_size),
                         num_classes=num_classes, num_train=n_train, num_test=n_test, name=name,
                         class_names=class_names)


for _name in TFDS_NAMES:
    _LOADERS.register(_name)(_tfds_loader)


def _tfds_root(builder):
    # builder.data_dir is ROOT/<name>/<version>
    return os.path.dirname(os.path.dirname(os.fspath(builder.data_dir)))


def _prepare_hint(name):
    return (f"on a machine with internet run `tfds build {name} --data_dir DIR` (or python -c "
            f"\"import tensorflow_datasets as tfds; tfds.load('{name}', data_dir='DIR')\"), "
            "copy DIR here and pass --data_dir DIR")


def _prepare(builder, name, download):
    """Make a not-yet-prepared TFDS dataset usable, or fail fast with one actionable line."""
    root = _tfds_root(builder)
    if not download:
        raise UserError(f"TFDS dataset {name!r} is not prepared in {root} (download disabled); "
                        + _prepare_hint(name))
    # TFDS retries unreachable URLs with backoff for minutes; find out in seconds instead.
    problem = _download_blocker(builder)
    if problem is None:
        try:
            builder.download_and_prepare()
            return
        except ImportError as e:
            problem = (f"missing Python module {e.name!r} (pip install {e.name})" if e.name
                       else one_line(e, 200))
        except Exception as e:  # network, checksum, disk... anything TFDS raises
            problem = one_line(e, 200)
    raise UserError(f"TFDS dataset {name!r} is not prepared in {root} and downloading it failed "
                    f"({problem}); " + _prepare_hint(name))


def _download_blocker(builder, timeout=NETWORK_CHECK_SECONDS):
    """None if every download host of `builder` accepts a TCP connection, else why not.

    Skipped (None) behind a proxy, which a direct connection would not go through, and when TFDS
    cannot list the URLs: then download_and_prepare itself fails quickly with the real cause.
    """
    if any(os.environ.get(v) for v in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY",
                                        "all_proxy", "ALL_PROXY")):
        return None
    try:
        urls = list((builder.url_infos or {}).keys())
    except Exception:
        return None
    targets = set()
    for url in urls:
        u = urlparse(url)
        if u.hostname:
            targets.add((u.hostname, u.port or (443 if u.scheme == "https" else 80)))
    result = {}

    def probe():
        for host, port in sorted(targets):
            try:
                socket.create_connection((host, port), timeout=timeout).close()
            except OSError as e:
                result["problem"] = f"cannot reach {host}:{port}: {one_line(e, 200)}"
                return
        result["problem"] = None

    # Name resolution ignores socket timeouts, so bound the whole probe with a thread.
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    if "problem" not in result:
        return f"no answer from {', '.join(h for h, _ in sorted(targets))} within {timeout:g}s"
    return result["problem"]


# ----------------------------------------------------------------------------- image folders

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
        return _resize(image, input_size), label

    train_ds = tf.data.Dataset.from_tensor_slices((tf.constant(tr_files, tf.string), tr_labels))
    train_ds = _shuffle(train_ds, len(tr_files) if shuffle_buffer > 0 else 0, seed)
    train_ds = train_ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test_ds = tf.data.Dataset.from_tensor_slices(
        (tf.constant(te_files, tf.string), te_labels.reshape(-1)))
    test_ds = test_ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if len(te_files) * input_size * input_size * 3 * 4 <= CACHE_BUDGET_BYTES:
        test_ds = test_ds.cache()
    return DatasetBundle(train=_batch(train_ds, batch_size), test=_batch(test_ds, 2 * batch_size),
                         num_classes=len(class_names), num_train=len(tr_files),
                         num_test=len(te_files), name=os.path.basename(folder) or folder,
                         class_names=class_names, skipped=tuple(skipped),
                         files=tuple(tr_files + te_files))


# ----------------------------------------------------------------------------- synthetic

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
# fine-tuning tasks.  Measured with the 32-48-64 smallcnn at 64 px (README command 1: 12 epochs,
# 4800 target images, batch 32, Adam 1e-3, 1024 test images; seeds 0-4), best test accuracy
# under full training's: with 6 orientations (18 classes, 15 degrees apart from the target's
# nearest) the last stage plus the head, trained fixed, ended 3.8 points under on average and
# ElasticTrainer 3.5; with 12 orientations (36 classes, 7.5 degrees apart, closer than the
# generator's +-8 degree jitter, so the early stages must resolve orientation finely) the
# same fixed selection ended 0.2 under and the head alone 15.8 under.  Earlier, on the 16-32-64
# model with 512 target images, two source frequencies between the target's (4.0, 7.25) left
# the last stage plus head 6-10 points under, and five frequencies x 4 orientations let the head
# alone come within 2 points of full training.
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


def _synthetic_source(input_size, num_examples, num_classes, seed, split, params=None):
    """(dataset of (index, label), generator fn (index, label) -> (image, label)).

    Callers shuffle the cheap (index, label) dataset, then map the generator over it.
    params: the classes' (orientation, frequency, tint) arrays; default
    _synthetic_class_params(num_classes), the `synthetic` dataset's.
    """
    input_size, num_examples, num_classes = int(input_size), int(num_examples), int(num_classes)
    labels = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(split)]).permutation(
        np.arange(num_examples) % num_classes).astype(np.int32)
    if params is None:
        params = _synthetic_class_params(num_classes)
    orient, freq, tint = (tf.constant(a) for a in params)
    coords = (np.arange(input_size, dtype=np.float32) + 0.5) / input_size - 0.5
    yy, xx = (tf.constant(a) for a in np.meshgrid(coords, coords, indexing="ij"))
    stream = tf.constant([int(seed), int(split) << 40], tf.int64)

    def make(index, label):
        key = stream + tf.stack([tf.constant(0, tf.int64), index])
        keys = tf.random.experimental.stateless_split(key, num=3)
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

    indices = tf.data.Dataset.from_tensor_slices((tf.range(num_examples, dtype=tf.int64), labels))
    return indices, make


# A training set up to this size (as 8-bit pixels) is generated once and kept in memory: drawing
# an image costs more CPU than decoding a JPEG, and on a 2-core device that work would take the
# cores from training for the whole run (smallcnn at 64 px, batch 32: 6.7 ms of generation per
# 40 ms step).  Larger sets are generated batch by batch, as they are drawn.
SYN_MEMORY_BYTES = 64 * 2**20


def _generated_once(indices, make):
    """`make`, answered from a table of all its images made once (index i -> row i)."""
    rows = indices.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    table = tf.constant(np.concatenate([x.numpy().astype(np.uint8) for x, _ in rows.batch(256)]))

    def lookup(index, label):
        return tf.cast(tf.gather(table, index), tf.float32), label

    return lookup


def synthetic_dataset(input_size=224, num_classes=NUM_CLASSES["synthetic"], num_train=512,
                      num_test=512, seed=0, batch_size=4, shuffle_buffer=1000):
    """The built-in 'synthetic' dataset (see synthetic_examples) as a DatasetBundle."""
    input_size = _positive_int(input_size, "input_size")
    num_classes = _positive_int(num_classes, "num_classes")
    num_train = _positive_int(num_train, "num_train")
    num_test = _positive_int(num_test, "num_test")
    batch_size = _positive_int(batch_size, "batch_size")
    if num_classes < 2:
        raise UserError(f"synthetic data needs num_classes >= 2, got {num_classes}")
    train, make = _synthetic_source(input_size, num_train, num_classes, seed, split=0)
    if num_train * input_size * input_size * 3 <= SYN_MEMORY_BYTES:
        make = _generated_once(train, make)
    train = _shuffle(train, num_train if shuffle_buffer > 0 else 0, seed)
    train = train.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test = synthetic_examples(input_size, num_test, num_classes, seed, split=1)
    return DatasetBundle(train=_batch(train, batch_size), test=_batch(test, 2 * batch_size),
                         num_classes=num_classes, num_train=num_train, num_test=num_test,
                         name="synthetic",
                         class_names=tuple(f"class_{i}" for i in range(num_classes)))


_LOADERS.register("synthetic")(synthetic_dataset)


def synthetic_source_examples(input_size, num_examples, seed=0, split=0):
    """The source task of `--weights synthetic`: like synthetic_examples, but with the
    SOURCE_NUM_CLASSES classes of synthetic_source_class_params (disjoint from the `synthetic`
    dataset's) and its own random stream."""
    indices, make = _synthetic_source(input_size, num_examples, SOURCE_NUM_CLASSES, seed, split,
                                      params=synthetic_source_class_params())
    return indices.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
