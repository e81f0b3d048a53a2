"""data/: TFDS (mocked and really prepared, offline), image folders, synthetic data, shuffling:
datasets read through their input pipelines (what is refused before any is read is
unit/test_data.py's)."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from elastictrainer.errors import UserError

from elastictrainer import data
from elastictrainer.data import loaders, synthetic
from helpers import TFDS_CLASSES, write_image_folder


def _arrays(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


def _check_batches(bundle, input_size, batch_size):
    """Element format, batch sizes (train B, test 2B, last batch partial) and label range."""
    for ds, n, b in ((bundle.train, bundle.num_train, batch_size),
                     (bundle.test, bundle.num_test, 2 * batch_size)):
        sizes = []
        for x, y in ds:
            assert x.dtype == tf.float32 and y.dtype == tf.int32
            assert x.shape[1:] == (input_size, input_size, 3)
            assert y.shape == (x.shape[0],)
            assert 0.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 255.0
            assert 0 <= int(tf.reduce_min(y)) and int(tf.reduce_max(y)) < bundle.num_classes
            sizes.append(int(x.shape[0]))
        assert sum(sizes) == n
        assert all(s == b for s in sizes[:-1]) and 0 < sizes[-1] <= b


# ------------------------------------------------------------------------------------------------
# TFDS
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TFDS_CLASSES))
def test_tfds_mock_data(name, tmp_path, no_network_check):
    with tfds.testing.mock_data(num_examples=10):
        bundle = loaders.load_dataset(name, input_size=32, batch_size=4, seed=0, data_dir=tmp_path)
        assert bundle.name == name
        assert bundle.num_classes == TFDS_CLASSES[name]
        assert (bundle.num_train, bundle.num_test) == (10, 10)
        _check_batches(bundle, 32, 4)
        x, _ = next(iter(bundle.train))
        assert x.shape == (4, 32, 32, 3)


def _fake_value(feature, h, w, rng):
    """A valid example value for any feature the three builders use."""
    F = tfds.features
    if isinstance(feature, F.FeaturesDict):
        return {k: _fake_value(f, h, w, rng) for k, f in feature.items()}
    if isinstance(feature, F.Sequence):
        return [_fake_value(feature.feature, h, w, rng)]
    if isinstance(feature, F.Image):
        return rng.integers(0, 256, (h, w, feature.shape[-1]), dtype=np.uint8)
    if isinstance(feature, F.ClassLabel):
        return int(rng.integers(feature.num_classes))
    if isinstance(feature, F.BBoxFeature):
        return F.BBox(0.1, 0.2, 0.6, 0.7)
    if isinstance(feature, F.Text):
        return "fake"
    raise AssertionError(f"no fake value for {feature!r}")


def _prepare_fake_tfds(name, data_dir, n_train, n_test):
    """Write a real (tiny, random) prepared copy of TFDS dataset `name` into data_dir, offline.

    A subclass of the real builder under the same name generates fake examples instead of
    downloading; tfds then writes the usual tfrecords + dataset_info.json, so the reading path is
    the one real users take.
    """
    base = tfds.builder_cls(name)

    def split_generators(self, dl_manager):
        return {"train": self._fake(n_train, 0), "test": self._fake(n_test, 1000)}

    def fake(self, n, offset):
        rng = np.random.default_rng(offset)
        for i in range(n):
            h, w = (int(v) for v in rng.integers(12, 48, size=2))
            yield f"ex{offset + i}", _fake_value(self.info.features, h, w, rng)

    from tensorflow_datasets.core import registered
    with registered.skip_registration():
        cls = type("Fake" + base.__name__, (base,), {
            "name": name, "url_infos": None, "_split_generators": split_generators,
            "_fake": fake, "_get_pkg_dir_path": classmethod(lambda c: base._get_pkg_dir_path()),
        })
    builder = cls(data_dir=str(data_dir))
    builder.download_and_prepare()
    assert builder.is_prepared()


@pytest.mark.parametrize("name", sorted(TFDS_CLASSES))
def test_tfds_prepared_on_disk(name, tmp_path):
    _prepare_fake_tfds(name, tmp_path, n_train=7, n_test=3)
    bundle = loaders.load_dataset(name, input_size=24, batch_size=2, seed=0, data_dir=tmp_path,
                               download=False)
    assert (bundle.num_train, bundle.num_test, bundle.num_classes) == (7, 3, TFDS_CLASSES[name])
    _check_batches(bundle, 24, 2)
    if name == "oxford_iiit_pet":
        assert bundle.class_names[0] == "Abyssinian"
    # test split fixed, train reshuffled per epoch but reproducible under the seed
    assert np.array_equal(_arrays(bundle.test)[1], _arrays(bundle.test)[1])
    one, two = (loaders.load_dataset(name, input_size=24, batch_size=2, seed=0, data_dir=tmp_path,
                                  download=False) for _ in range(2))
    epochs = []
    for _ in range(2):
        a, b = _arrays(one.train), _arrays(two.train)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        epochs.append(a[0])
    assert not np.array_equal(epochs[0], epochs[1])


# ------------------------------------------------------------------------------------------------
# image folders
# ------------------------------------------------------------------------------------------------

def _ids(ds):
    """Each image's red value (its identity, see _write_folder)."""
    x, _ = _arrays(ds)
    return sorted(int(round(v)) for v in x[:, 0, 0, 0])


def test_folder_held_out_split(tmp_path):
    write_image_folder(tmp_path / "pets")
    (tmp_path / "pets" / "notes.txt").write_text("not an image")
    bundle = loaders.load_dataset(str(tmp_path / "pets"), input_size=16, batch_size=4, seed=0)
    assert bundle.num_classes == 3 and bundle.class_names == ("cat", "dog", "eel")
    assert (bundle.num_train, bundle.num_test) == (12, 3)
    assert bundle.name == "pets"
    _check_batches(bundle, 16, 4)
    train_ids, test_ids = _ids(bundle.train), _ids(bundle.test)
    assert set(train_ids).isdisjoint(test_ids) and len(set(train_ids) | set(test_ids)) == 15
    # one test image per class; labels agree with the class folder
    x, y = _arrays(bundle.test)
    assert sorted(y.tolist()) == [0, 1, 2]
    assert all(int(round(r)) // 80 == label for r, label in zip(x[:, 0, 0, 0], y))
    # deterministic under the seed, and the seed matters
    again = loaders.load_dataset(str(tmp_path / "pets"), input_size=16, batch_size=4, seed=0)
    assert _ids(again.test) == test_ids
    others = {tuple(_ids(loaders.load_dataset(str(tmp_path / "pets"), input_size=16, seed=s).test))
              for s in range(1, 6)}
    assert len(others | {tuple(test_ids)}) > 1


def test_folder_train_test_layout(tmp_path):
    write_image_folder(tmp_path / "train", per_class=4)
    write_image_folder(tmp_path / "test", per_class=2, fmt="jpg")
    bundle = loaders.load_dataset(str(tmp_path), input_size=20, batch_size=3, seed=0)
    assert (bundle.num_classes, bundle.num_train, bundle.num_test) == (3, 12, 6)
    _check_batches(bundle, 20, 3)
    assert sorted(_arrays(bundle.test)[1].tolist()) == [0, 0, 1, 1, 2, 2]


def test_folder_grayscale_and_nested(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    Image.new("L", (9, 7), 100).save(tmp_path / "a" / "sub" / "x.png")
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "a" / "y.bmp")
    Image.new("RGB", (8, 8), (4, 5, 6)).save(tmp_path / "b" / "z.gif")
    Image.new("RGB", (8, 8), (7, 8, 9)).save(tmp_path / "b" / "w.JPEG")
    bundle = loaders.load_dataset(str(tmp_path), input_size=8, batch_size=2)
    assert (bundle.num_classes, bundle.num_train, bundle.num_test) == (2, 2, 2)
    _check_batches(bundle, 8, 2)


# ------------------------------------------------------------------------------------------------
# synthetic
# ------------------------------------------------------------------------------------------------

def test_synthetic_deterministic_and_shapes():
    a, b, c = (loaders.load_dataset("synthetic", input_size=16, batch_size=8, seed=s, num_train=40,
                                 num_test=20) for s in (1, 1, 2))
    assert (a.num_classes, a.num_train, a.num_test, a.name) == (10, 40, 20, "synthetic")
    _check_batches(a, 16, 8)
    xa, ya = _arrays(a.test)
    xb, yb = _arrays(b.test)
    xc, yc = _arrays(c.test)
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not np.array_equal(xa, xc) and not np.array_equal(ya, yc)
    assert np.bincount(ya, minlength=10).tolist() == [2] * 10  # balanced labels
    big = loaders.load_dataset("synthetic", input_size=96, batch_size=4, num_classes=5, num_train=6,
                            num_test=3)
    _check_batches(big, 96, 4)
    x, _ = next(iter(big.train))
    assert float(tf.math.reduce_std(x)) > 5  # an image, not a constant


def _generated_test_split(name, size, num_test):
    """The test split (images, labels) of 40-class generated dataset `name` on seed 3, after
    checking that it is the same on seed 3 again, another on seed 4, and balanced."""
    a, b, c = (loaders.load_dataset(name, input_size=size, batch_size=8, seed=s, num_train=16,
                                    num_test=num_test) for s in (3, 3, 4))
    assert (a.num_classes, a.num_test, a.name) == (40, num_test, name)
    _check_batches(a, size, 8)
    xa, ya = _arrays(a.test)
    xb, yb = _arrays(b.test)
    xc, _ = _arrays(c.test)
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb) and not np.array_equal(xa, xc)
    assert np.bincount(ya, minlength=40).tolist() == [num_test // 40] * 40
    return xa, ya


def test_synthetic_objects_fine_grained_deterministic_and_balanced():
    from elastictrainer.data import objects

    attributes = objects.class_attributes()
    assert attributes.shape == (40, 4) and len({tuple(a) for a in attributes}) == 40
    # fine-grained: any two classes two attributes apart or more, most with a class at two
    differ = (attributes[:, None] != attributes[None]).sum(-1) + 4 * np.eye(40, dtype=int)
    assert differ.min() == 2 and (differ == 2).any(axis=1).sum() >= 30
    xa, ya = _generated_test_split("synthetic_objects", 32, 80)
    # two images of one class differ (pose, background)
    first, second = (np.flatnonzero(ya == 0)[i] for i in (0, 1))
    assert np.abs(xa[first] - xa[second]).mean() > 10
    with pytest.raises(UserError):
        loaders.load_dataset("synthetic_objects", num_classes=1)


def test_synthetic_shifted_is_synthetic_seen_through_the_fixed_shift():
    """Test split: example i of the synthetic dataset, shifted as example i of split 1, the
    same shift on every seed; labels as the synthetic dataset's."""
    from elastictrainer.data.domain_shift import DomainShift, shift_image

    kw = dict(input_size=32, batch_size=4, num_train=8, num_test=6)
    plain, moved = (loaders.load_dataset(name, seed=2, **kw)
                    for name in ("synthetic", "synthetic_shifted"))
    assert (moved.name, moved.num_classes) == ("synthetic_shifted", 10)
    _check_batches(moved, 32, 4)
    xp, yp = _arrays(plain.test)
    xs, ys = _arrays(moved.test)
    assert np.array_equal(yp, ys)
    by_hand = [shift_image(tf.constant(x), i, DomainShift(), split=1).numpy()
               for i, x in enumerate(xp)]
    np.testing.assert_array_equal(xs, np.stack(by_hand))
    assert np.abs(xs - xp).mean() > 40  # inverted colours: far from the unshifted images
    assert synthetic.SHIFTED_NAME in loaders.DATASET_NAMES


def test_synthetic_images_are_drawn_in_the_pipelines_graph():
    """Fast at any size because every image is drawn by TensorFlow ops in the input pipeline's
    graph: no Python function runs per image (the graph is the same at 224 px as here)."""
    bundle = loaders.load_dataset("synthetic", input_size=32, batch_size=64)
    for ds in (bundle.train, bundle.test):
        graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
        ops = {node.op for node in graph.node}
        ops |= {node.op for f in graph.library.function for node in f.node_def}
        assert "MapDataset" in ops or "ParallelMapDataset" in ops or "ParallelMapDatasetV2" in ops
        assert not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}, ops
    n = sum(int(x.shape[0]) for x, _ in bundle.train)
    assert n == 512


def test_synthetic_learnable_by_tiny_cnn():
    import tf_keras as keras
    keras.utils.set_random_seed(0)
    bundle = loaders.load_dataset("synthetic", input_size=32, batch_size=32, seed=0)
    model = keras.Sequential([
        keras.layers.Rescaling(1 / 255.0, input_shape=(32, 32, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(bundle.num_classes),
    ])
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(bundle.train, epochs=15, verbose=0)
    _, accuracy = model.evaluate(bundle.test, verbose=0)
    assert accuracy > 0.5, accuracy  # chance is 0.1


# ------------------------------------------------------------------------------------------------
# shuffling and names
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["synthetic", "folder"])
def test_train_reshuffled_each_epoch_under_seed(source, tmp_path):
    if source == "folder":
        write_image_folder(tmp_path, per_class=10)
        load = lambda seed: loaders.load_dataset(str(tmp_path), input_size=8, batch_size=4, seed=seed)
        order = lambda ds: _ids_in_order(ds)
    else:
        load = lambda seed: loaders.load_dataset("synthetic", input_size=8, batch_size=4, seed=seed,
                                              num_train=48, num_test=8)
        order = lambda ds: _arrays(ds)[0][:, :, :, 0].reshape(-1, 64).sum(axis=1).round(3).tolist()
    a, b, c = load(7), load(7), load(8)
    a1, a2, a3 = order(a.train), order(a.train), order(a.train)
    assert a1 != a2 and a2 != a3 and sorted(a1) == sorted(a2)
    assert order(b.train) == a1 and order(b.train) == a2
    assert order(c.train) != a1
    assert order(a.test) == order(a.test)


def _ids_in_order(ds):
    x, _ = _arrays(ds)
    return [int(round(v)) for v in x[:, 0, 0, 0]]


def test_shuffle_buffer_zero_keeps_order():
    bundle = loaders.load_dataset("synthetic", input_size=8, seed=0, num_train=20, shuffle_buffer=0)
    assert np.array_equal(_arrays(bundle.train)[1], _arrays(bundle.train)[1])


def test_known_class_counts_match_tfds_metadata_and_synthetic():
    for name in data.TFDS_NAMES:
        builder = tfds.builder(name, data_dir="/nonexistent-offline")  # metadata from code only
        assert builder.info.features["label"].num_classes == data.NUM_CLASSES[name], name
    bundle = loaders.load_dataset("synthetic", input_size=16, batch_size=4)
    assert bundle.num_classes == data.NUM_CLASSES["synthetic"]
    assert set(data.NUM_CLASSES) == set(data.DATASET_NAMES)


def test_synthetic_training_set_kept_in_memory_is_the_generated_one(monkeypatch):
    """A small training set (and test split) is generated once and kept as uint8
    (SYN_MEMORY_BYTES); its batches, order included, are exactly those generated on the fly,
    epoch after epoch."""
    def epochs(n):
        bundle = synthetic.synthetic_dataset(input_size=16, batch_size=8, num_train=40,
                                             num_test=24, seed=4)
        return ([[(x.numpy(), y.numpy()) for x, y in bundle.train] for _ in range(n)],
                [(x.numpy(), y.numpy()) for x, y in bundle.test])

    kept_once = []
    generated_once = synthetic._generated_once
    monkeypatch.setattr(synthetic, "_generated_once",
                        lambda *a: kept_once.append(a) or generated_once(*a))
    kept, kept_test = epochs(2)
    assert len(kept_once) == 2  # the training set and the test split
    monkeypatch.setattr(synthetic, "SYN_MEMORY_BYTES", 0)
    streamed, streamed_test = epochs(2)
    # the test split too: kept in memory, it is the one generated on the fly
    for (xa, ya), (xb, yb) in zip(kept_test, streamed_test, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    for a, b in zip(kept, streamed):
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    assert not all(np.array_equal(a[0][1], b[0][1]) for a, b in [(kept[0], kept[1])])  # reshuffled
    assert np.all(kept[0][0][0] == np.round(kept[0][0][0]))  # 8-bit levels


def test_synthetic_textures_family_and_scale_make_the_class():
    """Deterministic per seed and balanced; a class is a family at a scale: a stripes image of
    the largest scale repeats about SCALES[3] / SCALES[0] times as often as one of the
    smallest (the peak of its spectrum), and --num_classes other than 40 is refused."""
    from elastictrainer.data import textures

    xa, ya = _generated_test_split("synthetic_textures", 64, 160)

    def peak(image):  # cycles per image width of the strongest frequency, the mean taken out
        grey = image.mean(-1) - image.mean()
        power = np.abs(np.fft.fft2(grey)) ** 2
        fy, fx = np.meshgrid(np.fft.fftfreq(64, 1 / 64), np.fft.fftfreq(64, 1 / 64),
                             indexing="ij")
        i = np.argmax(power)
        return np.hypot(fy.flat[i], fx.flat[i])

    stripes = textures.FAMILIES.index("stripes") * len(textures.SCALES)
    fine, coarse = ([peak(x) for x in xa[ya == stripes + level]] for level in (3, 0))
    ratio = np.median(fine) / np.median(coarse)
    expected = textures.SCALES[3] / textures.SCALES[0]
    assert 0.75 * expected < ratio < 1.25 * expected, ratio
    with pytest.raises(UserError):
        loaders.load_dataset("synthetic_textures", num_classes=10)
