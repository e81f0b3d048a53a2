"""TensorFlow Datasets by name (data.TFDS_NAMES): prepared data is read from the TFDS folder;
what is missing is downloaded by TFDS, or named in one line saying how to get it when the
machine is offline."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import contextlib
import logging
import os
import socket
import threading
from urllib.parse import urlparse

import tensorflow as tf

from elastictrainer.errors import UserError, one_line
from elastictrainer.data import TFDS_NAMES
from elastictrainer.data.pipeline import LOADERS, DatasetBundle, batch, resize, shuffle

# How long the "can we reach the download servers" check may take before we call it offline.
NETWORK_CHECK_SECONDS = 5.0


def _tfds_loader(name, *, input_size, batch_size, seed, shuffle_buffer, data_dir, download):
    import tensorflow_datasets as tfds

    data_dir = None if data_dir is None else os.path.expanduser(os.fspath(data_dir))
    try:
        with _quiet_absl():
            builder = tfds.builder(name, data_dir=data_dir)
            prepared = builder.is_prepared()
    except Exception as e:  # e.g. unreadable data_dir
        raise UserError(f"cannot open TFDS dataset {name!r} in {data_dir}: {one_line(e, 200)}"
                        ) from None
    if not prepared:
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
        return resize(image, input_size), tf.cast(label, tf.int32)

    train, n_train = split("train")
    test, n_test = split("test")
    train = shuffle(train, shuffle_buffer, seed)
    train = train.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    test = test.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return DatasetBundle(train=batch(train, batch_size), test=batch(test, 2 * batch_size),
                         num_classes=num_classes, num_train=n_train, num_test=n_test, name=name,
                         class_names=class_names)


for _name in TFDS_NAMES:
    LOADERS.register(_name)(_tfds_loader)


@contextlib.contextmanager
def _quiet_absl():
    """TFDS's warnings on its own look-up (through absl: "Variant folder ... has no
    dataset_info.json" for a dataset not prepared yet) are held back: where it is not prepared,
    the one line _prepare raises says what to do."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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
