"""--cache_frozen_prefix (prefix/cache.py, prefix/graph.py): the cut points of a model and the
random ops in their prefixes, cached and uncached runs that agree step by step, stores that
go stale, and the ways a cache turns itself off or is never on; tf-keras models first, then
Keras 3 ones (the nesting's training mode as Keras 3 gives it)."""
import errno
import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
import keras as keras3
import tf_keras as keras

from helpers import image_data
from elastictrainer import config, runlog
from elastictrainer.runs import loop
from elastictrainer.prefix import plan as prefix_plan, store as prefix_store
from elastictrainer.errors import UserError
from elastictrainer.flavors import batchnorm
from elastictrainer.method.roles import tensor_roles
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.prefix.graph import FlatGraph
from elastictrainer.train.compiled import CompiledSteps

SIZE, CLASSES, EXAMPLES, BATCH = 16, 4, 40, 8


def nested_model(bn_training=False, augment=False, seed=0):
    """Input -> [RandomFlip] -> Rescaling -> a nested conv-BN-ReLU backbone called in
    inference mode (as the built-in models call theirs; bn_training: in the step's mode) ->
    pool -> dropout -> dense.  Seeded."""
    keras.utils.set_random_seed(seed)
    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.RandomFlip("horizontal", name="flip")(image) if augment else image
    x = keras.layers.Rescaling(1 / 255.0, name="scale")(x)
    inner = keras.Input((SIZE, SIZE, 3))
    h = inner
    for i, width in enumerate((8, 12)):
        h = keras.layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False,
                                name=f"conv{i}")(h)
        h = keras.layers.BatchNormalization(name=f"bn{i}")(h)
        h = keras.layers.ReLU(name=f"relu{i}")(h)
    x = keras.Model(inner, h, name="backbone")(x, training=None if bn_training else False)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dropout(0.2, name="dropout", force_generator=True)(x)
    return keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x), name="nested")


def plain_cnn(seed=0):
    """Input -> conv0 -> ReLU -> conv1 -> ReLU -> pool -> dense: no BatchNorm, no dropout, so
    its forward pass in training mode is a function of the weights alone; conv0 reads the input,
    so no cut lies below it."""
    keras.utils.set_random_seed(seed)
    x = image = keras.Input((SIZE, SIZE, 3))
    for i, width in enumerate((8, 12)):
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", name=f"conv{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x), name="plain")


class UserFlip(keras.layers.Layer):
    """A user's augmentation: tf.image.random_flip_left_right, no Keras random generator."""

    def call(self, x):
        return tf.image.random_flip_left_right(x)


class MappedFlip(keras.layers.Layer):
    """Each image flipped by a stateless random op inside tf.map_fn (a while loop's body)."""

    def call(self, x):
        return tf.map_fn(lambda im: tf.image.stateless_random_flip_left_right(im, (1, 2)), x)


def noise(name="noise"):
    """A Lambda adding uniform noise."""
    return keras.layers.Lambda(lambda t: t + tf.random.uniform(tf.shape(t)), name=name)


FRONTS = {"lambda noise": (lambda: noise(), "RandomUniform"),
          "tf.image.random_flip_left_right": (lambda: UserFlip(name="noise"), "RandomUniform"),
          "stateless flip in tf.map_fn": (lambda: MappedFlip(name="noise"),
                                          "StatelessRandomUniformV2"),
          "keras RandomFlip": (lambda: keras.layers.RandomFlip("horizontal", name="noise"),
                               "RngReadAndSkip")}


def fronted_cnn(front, seed=0):
    """Input -> `front` (a layer of the user's) -> plain_cnn's layers."""
    keras.utils.set_random_seed(seed)
    image = keras.Input((SIZE, SIZE, 3))
    x = front(image)
    for i, width in enumerate((8, 12)):
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", name=f"conv{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x), name="fronted")


def data(seed=0):
    """(train, test): EXAMPLES fixed images, reshuffled every epoch under the seed."""
    return image_data(EXAMPLES, SIZE, CLASSES, BATCH, seed)


def cfg(tmp_path, name, **kw):
    base = dict(train_type="traditional_tl_training", optimizer="adam", learning_rate=0.01,
                num_epochs=3, logdir=str(tmp_path), run_name=name, progress=False,
                energy="none")
    return config.Config(**{**base, **kw})


def losses_of(monkeypatch, run):
    """The per-step training losses of `run()` (every trained batch, in order)."""
    seen = []
    original = CompiledSteps.batch_stats

    def record(self, outputs, y):
        stats = original(self, outputs, y)
        seen.append(stats[0])
        return stats

    monkeypatch.setattr(CompiledSteps, "batch_stats", record)
    summary = run()
    monkeypatch.setattr(CompiledSteps, "batch_stats", original)
    return np.array(seen), summary


def test_cut_points_of_a_nested_model_and_the_sub_models_share_its_weights():
    model = nested_model()
    graph = FlatGraph(model)
    names = [c.name for c in graph.cuts]
    # the backbone is flattened: its layers' outputs are cut points
    assert names == ["scale", "conv0", "bn0", "relu0", "conv1", "bn1", "relu1", "pool",
                     "dropout"]
    relu0 = graph.cuts[names.index("relu0")]
    assert relu0.shape == (8, 8, 8) and relu0.bytes_per_example == 8 * 8 * 8 * 4
    assert 0 < relu0.forward_share < graph.cuts[names.index("scale")].forward_share < 1
    # the backbone runs in inference mode: its BatchNorm makes no prefix batch-dependent
    assert all(not c.batch_prefix for c in graph.cuts)
    assert graph.cuts[names.index("dropout")].random_prefix == ("dropout",)
    # conv0, bn0 gamma, beta, conv1, bn1 gamma, beta, head kernel, bias
    tensor_cuts = graph.tensor_cuts(model.trainable_weights)
    assert [names[k] for k in tensor_cuts] == ["scale", "conv0", "conv0", "relu0", "conv1",
                                               "conv1", "dropout", "dropout"]
    prefix, suffix = graph.prefix_model(relu0), graph.suffix_model(relu0)
    assert [id(w) for w in suffix.trainable_weights] == [id(w) for w in
                                                         model.trainable_weights[3:]]
    x = tf.random.uniform((3, SIZE, SIZE, 3), 0, 255)
    np.testing.assert_array_equal(suffix(prefix(x, training=False), training=False),
                                  model(x, training=False))


def test_batchnorm_in_the_steps_mode_keeps_the_cut_above_it():
    graph = FlatGraph(nested_model(bn_training=True))
    sound = [c.name for c in graph.cuts if not c.batch_prefix]
    assert sound == ["scale", "conv0"]  # bn0 computes batch statistics: no cut after it


@pytest.mark.parametrize("bn_training", [False, True])
def test_a_cached_run_trains_as_the_uncached_one_step_by_step(tmp_path, monkeypatch,
                                                              bn_training):
    """The head trains (a fixed selection); its frozen prefix holds BatchNorm in the mode the
    uncached run uses: inference (cached at the pool) or batch statistics (cached below)."""
    def run(cached):
        c = cfg(tmp_path, f"r{int(cached)}", cache_frozen_prefix=cached)
        return loop.run(c, log=lambda m: None, model=nested_model(bn_training), data=data())

    plain, _ = losses_of(monkeypatch, lambda: run(False))
    cached, summary = losses_of(monkeypatch, lambda: run(True))
    steps = 3 * EXAMPLES // BATCH
    assert len(plain) == len(cached) == steps
    np.testing.assert_allclose(cached, plain, rtol=2e-5, atol=1e-6)
    pc = summary["prefix_cache"]
    build, = pc["builds"]
    assert build["cut"] == ("conv0" if bn_training else "pool")
    assert build["rows"] == EXAMPLES and build["where"] == "memory"
    # the first epoch filled the cache, the two others were served from it
    assert pc["fill_steps"] == steps // 3 and pc["served_steps"] == 2 * steps // 3
    assert pc["served_share"] == pytest.approx(2 / 3) and pc["fill_s"] > 0
    assert summary["version"] == runlog.SUMMARY_VERSION and pc["off"] is None


def test_a_step_that_trains_below_a_cut_leaves_no_stale_activations_behind(tmp_path):
    """Selections the elastic runtime may pick one after the other: the head (cut at the pool),
    every tensor (no cut), conv1 and the head (cut below conv1), the head again.  Each cached
    step's logits must be the model's own at that moment: a store filled before conv0 or conv1
    changed would serve what the prefix computed with the old weights."""
    model = plain_cnn()
    train, _ = data()
    batches = list(train)
    cache = prefix_plan.plan(model, model.trainable_weights,
                              cfg(tmp_path, "stale", cache_frozen_prefix=True), EXAMPLES,
                              str(tmp_path / "stale"), log=lambda m: None)
    trainer = CompiledSteps(model, keras.optimizers.SGD(1e-3), SCHEMES["elastic_training"],
                            tensor_roles(model), prefix_cache=cache)
    names = [w.name.split("/")[0] for w in model.trainable_weights]
    head = tuple(i for i, n in enumerate(names) if n == "head")
    conv1 = tuple(i for i, n in enumerate(names) if n in ("conv1", "head"))
    every = tuple(range(len(names)))
    assert [cache.cuts[cache.cut_of(s)].name for s in (head, conv1)] == ["pool", "relu0"]
    assert cache.cut_of(every) is None

    def train_on(selection, x, y):
        expected = model(x, training=True).numpy()  # what the step's forward pass must give
        step = trainer.step_for(selection)
        _, logits = step(x, y)
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
        return getattr(step, "filled", False)

    assert all(train_on(head, x, y) for x, y in batches)  # the first pass fills the store
    x, y = batches[0]
    trainer.probe_step(x, y, want_terms=True)  # every gradient, no update: the store holds
    assert not train_on(head, x, y)
    served = cache.served_steps
    assert not train_on(every, x, y)  # trains conv0 and conv1, below the pool
    assert train_on(head, *batches[1])  # filled again, not served from the old store
    assert cache.served_steps == served and len(cache.builds) == 2
    for x, y in batches[2:]:
        train_on(head, x, y)
    assert all(train_on(conv1, x, y) for x, y in batches)  # conv1 trains: a store at relu0
    assert train_on(head, *batches[0]) and len(cache.builds) == 4
    # the first store went stale; the others gave way to another cut
    assert [b.stale for b in cache.builds] == [True, False, False, False]


def test_a_cut_below_the_first_weights_is_never_cached(tmp_path):
    """flip -> scale -> conv0: the cuts after the flip and the rescaling hold no trainable
    tensor below them.  Cached, they would replay the augmentation and price a selection of
    every tensor (conv0 included) as a cached one."""
    model = nested_model(augment=True)
    assert [c.name for c in FlatGraph(model).cuts][:3] == ["flip", "scale", "conv0"]
    cache = prefix_plan.plan(model, model.trainable_weights,
                             cfg(tmp_path, "weightless", cache_frozen_prefix=True), EXAMPLES,
                             str(tmp_path / "weightless"), log=lambda m: None)
    assert [c.name for c in cache.cuts][0] == "conv0"
    assert cache.cut_of(tuple(range(len(model.trainable_weights)))) is None


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_random_ops_are_found_in_the_traced_prefix_whatever_layer_draws_them(front):
    make, op = FRONTS[front]
    graph = FlatGraph(fronted_cnn(make()))
    assert op in graph.random_ops["noise"] and list(graph.random_ops) == ["noise"]
    # before the first weights: augmentation below every cut
    assert all(c.augmentation == ("noise",) and not c.random_prefix for c in graph.cuts)


def test_random_ops_after_the_first_weights_hold_back_the_cuts_above_them_only():
    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, name="conv0")(image)
    x = noise()(x)
    inner = keras.Input(x.shape[1:])  # a backbone whose dropout runs in inference mode
    x = keras.Model(inner, keras.layers.Dropout(0.5, name="drop")(inner))(x, training=False)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    graph = FlatGraph(keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x)))
    assert list(graph.random_ops) == ["noise"]
    assert {c.name: c.random_prefix for c in graph.cuts} == {
        "conv0": (), "noise": ("noise",), "drop": ("noise",), "pool": ("noise",)}
    assert all(not c.augmentation for c in graph.cuts)
    assert FlatGraph(plain_cnn()).random_ops == {}


@pytest.mark.parametrize("front", ["lambda noise", "tf.image.random_flip_left_right"])
def test_a_users_random_layer_is_cached_as_augmented_views(tmp_path, front):
    make, op = FRONTS[front]
    lines = []
    summary = loop.run(cfg(tmp_path, "views", cache_frozen_prefix=True), log=lines.append,
                       model=fronted_cnn(make()), data=data())
    pc = summary["prefix_cache"]
    # the budget holds 2 views: the first two epochs store one each, the third draws among them
    assert pc["policy"] == "2 augmented views per image"
    assert (pc["fill_steps"], pc["served_steps"]) == (10, 5)
    assert pc["builds"][0]["rows"] == 2 * EXAMPLES
    assert sum(f"noise ({op}" in m and "kept as 2 views" in m for m in lines) == 1
    summary = loop.run(cfg(tmp_path, "fixed", cache_frozen_prefix=True, cache_fixed_views=True),
                       log=lambda m: None, model=fronted_cnn(make()), data=data())
    assert summary["prefix_cache"]["policy"] == "1 augmented view per image"
    assert summary["prefix_cache"]["served_steps"] == 10
    # without the random layer, the same model is cached as it was
    summary = loop.run(cfg(tmp_path, "plain", cache_frozen_prefix=True), log=lambda m: None,
                       model=plain_cnn(), data=data())
    assert summary["prefix_cache"]["policy"] == "deterministic prefix"
    assert summary["prefix_cache"]["served_steps"] == 10


def bn_first_cnn(seed=0):
    """fronted_cnn with a BatchNorm in the step's training mode at the input: every cut has
    it below."""
    return fronted_cnn(keras.layers.BatchNormalization(name="bn_in"), seed)


def test_no_usable_cut_is_said_in_one_line_with_why_also_in_the_refusal_it_leads_to(
        tmp_path, tmp_path_factory):
    from elastictrainer.profiler import run as prun
    from elastictrainer.profiler import table as ptable
    from elastictrainer.method.time_model import TimeModel

    lines = []
    summary = loop.run(cfg(tmp_path, "bn", cache_frozen_prefix=True, num_epochs=1),
                       log=lines.append, model=bn_first_cnn(), data=data())
    assert summary["status"] == "finished" and summary["prefix_cache"] is None
    why = ("no usable cut point: 6 of 6 have BatchNorm computing batch statistics below them "
           "(bn_in; ")
    said = [m for m in lines if why in m]
    assert len(said) == 1 and said[0].endswith("; training uncached")

    table = prun.profile_model(bn_first_cnn(), "bn_first", SIZE, BATCH, CLASSES,
                               num_iterations=2, progress=False, optimizer="adam")
    path = tmp_path_factory.mktemp("table") / "bn_first.json"
    ptable.save_table(table, str(path))
    floor = TimeModel(table).rho_floor
    with pytest.raises(UserError, match=r"below this model's forward floor") as refused:
        loop.run(cfg(tmp_path, "floor", train_type="elastic_training", rho=0.9 * floor,
                     timing_table=str(path), cache_frozen_prefix=True),
                 log=lambda m: None, model=bn_first_cnn(), data=data())
    message = str(refused.value)
    assert "\n" not in message
    assert f"; the prefix cache cannot lower it: {why}" in message
    # the default (auto) says it too; with the cache off the refusal is the uncached one
    with pytest.raises(UserError) as refused:
        loop.run(cfg(tmp_path, "auto", train_type="elastic_training", rho=0.9 * floor,
                     timing_table=str(path)), log=lambda m: None, model=bn_first_cnn(),
                 data=data())
    assert f"; the prefix cache cannot lower it: {why}" in str(refused.value)
    with pytest.raises(UserError) as refused:
        loop.run(cfg(tmp_path, "plain", train_type="elastic_training", rho=0.9 * floor,
                     timing_table=str(path), cache_frozen_prefix=False), log=lambda m: None,
                 model=bn_first_cnn(), data=data())
    assert "prefix cache" not in str(refused.value)


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_resumed_run_holds_the_store_it_left_and_trains_on_bit_for_bit(
        tmp_path, monkeypatch, on_disk):
    """Stopped (Ctrl-C) after its first epoch, with one of each image's two augmented views
    stored: the resumed run reads the store back from its files (a memory store's rows were
    written at the checkpoint; a file store is its own), fills the second views with the
    views the run left alone drew, and every later step trains on the same rows, drawn by the
    same generator: its losses are the uninterrupted run's, exactly."""
    budget = {"cache_budget_mb": 0} if on_disk else {}

    def run(name, log=lambda m: None):
        c = cfg(tmp_path, name, cache_frozen_prefix=True, cache_views=2, num_epochs=4, **budget)
        return loop.run(c, log=log, model=nested_model(augment=True), data=data())

    def ctrl_c_after_the_first_epoch(message):
        if message.startswith("epoch 1:"):
            os.kill(os.getpid(), signal.SIGINT)

    whole, left = losses_of(monkeypatch, lambda: run("whole"))
    first, stopped = losses_of(monkeypatch, lambda: run("resumed", ctrl_c_after_the_first_epoch))
    assert stopped["status"] == "interrupted" and len(first) == 5
    files = os.listdir(tmp_path / "resumed" / prefix_store.CACHE_DIR)
    assert "index-5.npz" in files and any(f.endswith(".bin") for f in files)
    said = []
    rest, summary = losses_of(monkeypatch, lambda: run("resumed", said.append))
    assert not any("cannot be put back" in m for m in said)
    np.testing.assert_array_equal(np.concatenate([first, rest]), whole)
    keys = ("fill_steps", "served_steps", "uncached_steps")
    assert [summary["prefix_cache"][k] for k in keys] == [left["prefix_cache"][k] for k in keys] \
        == [10, 10, 0]
    assert len(summary["prefix_cache"]["builds"]) == 1  # put back, not made again
    assert [e["test_loss"] for e in summary["epochs"]] == [e["test_loss"] for e in left["epochs"]]
    assert not (tmp_path / "resumed" / prefix_store.CACHE_DIR).exists()  # gone at the end


def test_checkpoints_keep_the_rows_files_they_name_and_no_others(tmp_path):
    """prune: an index file per kept checkpoint, the rows file each names and the live
    store's; everything else under the cache's directory goes."""
    from elastictrainer.prefix import persist

    directory = tmp_path / prefix_store.CACHE_DIR
    directory.mkdir()
    for step, build in ((5, 0), (10, 1), (15, 1)):
        np.savez(directory / f"index-{step}.npz", build=build, keys=np.zeros(0, np.uint64),
                 counts=np.zeros(0, np.int64))
    for name in ("0-pool.bin", "1-relu1.bin", "2-conv1.bin", "3-pool.bin", "x.tmp.npz"):
        (directory / name).write_bytes(b"")
    named = persist.prune(str(tmp_path), {10, 15}, current="3-pool.bin")
    assert named == {"1-relu1.bin"}
    assert sorted(os.listdir(directory)) == ["1-relu1.bin", "3-pool.bin", "index-10.npz",
                                             "index-15.npz"]


def test_random_augmentation_is_cached_as_the_views_asked_for(tmp_path):
    summary = loop.run(cfg(tmp_path, "views", cache_frozen_prefix=True, cache_views=3,
                           num_epochs=4), log=lambda m: None, model=nested_model(augment=True),
                       data=data())
    pc = summary["prefix_cache"]
    assert pc["policy"] == "3 augmented views per image"
    assert pc["peak_mb"] == max(b["bytes"] for b in pc["builds"]) / 2**20 > 0
    assert (pc["fill_steps"], pc["served_steps"]) == (15, 5)
    assert [c["views"] for c in pc["cuts"]] == [3] * len(pc["cuts"])


def test_beyond_the_memory_budget_the_cache_is_a_file_and_a_full_disk_turns_it_off(
        tmp_path, monkeypatch):
    lines = []
    # the disk's room is conftest's scripted 1 GB (a disk under its reserve caches nothing:
    # the next test's case)
    summary = loop.run(cfg(tmp_path, "disk", cache_frozen_prefix=True, cache_budget_mb=0),
                       log=lines.append, model=nested_model(), data=data())
    build, = summary["prefix_cache"]["builds"]
    assert build["where"].startswith(str(tmp_path / "disk" / prefix_store.CACHE_DIR))
    assert summary["prefix_cache"]["served_steps"] == 10
    assert not (tmp_path / "disk" / prefix_store.CACHE_DIR).exists()  # removed at the end

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefix_store.os, "pwrite", full)
    lines.clear()
    summary = loop.run(cfg(tmp_path, "full", cache_frozen_prefix=True, cache_budget_mb=0),
                       log=lines.append, model=nested_model(), data=data())
    assert summary["status"] == "finished" and len(summary["epochs"]) == 3
    pc = summary["prefix_cache"]
    assert "No space left on device" in pc["off"] and pc["served_steps"] == 0
    assert pc["uncached_steps"] == 15
    assert sum("the prefix cache is off" in m for m in lines) == 1


def test_no_room_anywhere_or_changing_images_leave_the_run_uncached(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(prefix_plan, "free_disk_bytes", lambda path: 0)
    summary = loop.run(cfg(tmp_path, "tiny", cache_frozen_prefix=True, cache_budget_mb=0.001),
                       log=lines.append, model=nested_model(), data=data())
    assert summary["status"] == "finished" and summary["prefix_cache"] is None
    assert any("fits neither --cache_budget_mb 0.001 nor the disk" in m for m in lines)
    # the default, auto, says the same in its own one line (not a warning) and trains on
    lines.clear()
    summary = loop.run(cfg(tmp_path, "tiny_auto", cache_frozen_prefix="auto",
                           cache_budget_mb=0.001), log=lines.append, model=nested_model(),
                       data=data())
    assert summary["status"] == "finished" and summary["prefix_cache"] is None
    said = [m for m in lines if "fits neither --cache_budget_mb 0.001 nor the disk" in m]
    assert len(said) == 1 and said[0].startswith("prefix cache off (--cache_frozen_prefix auto)")

    train, test = data()
    # random preprocessing in the input pipeline: each epoch's images differ
    noise = tf.data.Dataset.random(seed=1).map(lambda r: tf.cast(r % 1000, tf.float32) / 1000)
    noisy = tf.data.Dataset.zip((train, noise)).map(lambda b, r: (b[0] + r, b[1]))
    lines.clear()
    summary = loop.run(cfg(tmp_path, "noisy", cache_frozen_prefix=True), log=lines.append,
                       model=nested_model(), data=(noisy, test))
    pc = summary["prefix_cache"]
    assert "more distinct images than its 40 examples" in pc["off"]
    assert pc["served_steps"] == 0 and summary["status"] == "finished"


def test_an_elastic_run_below_the_uncached_forward_floor_trains_from_the_cache(
        tmp_path, nested_table):
    """One selection for the run (its table is profiled here, so which cut it picks varies; a
    selection per epoch could move the cut each time and fill a new store every epoch): the
    steps that store the images the probe and timed full steps left out are followed by served
    ones."""
    path, floor = nested_table
    summary = loop.run(cfg(tmp_path, "elastic", train_type="elastic_training", rho=0.9 * floor,
                           rho_feedback=False, economy=False, interval=10.0,
                           timing_table=str(path), cache_frozen_prefix=True, num_epochs=3),
                       log=lambda m: None, model=nested_model(), data=data())
    pc = summary["prefix_cache"]
    sels = summary["selections"]
    assert sels and all(s["cut"] is not None for s in sels)
    assert all(s["predicted_ratio"] <= 0.9 * floor + 1e-9 for s in sels)
    assert {b["cut"] for b in pc["builds"]} == {s["cut"] for s in sels}
    assert sum(s["fill_steps"] for s in sels) == pc["fill_steps"] > 0
    assert pc["served_steps"] > 0
    assert json.load(open(tmp_path / "elastic" / runlog.SUMMARY_FILE))["prefix_cache"] == pc


@pytest.fixture(scope="module")
def nested_table(tmp_path_factory):
    from elastictrainer.profiler import run as prun
    from elastictrainer.profiler import table as ptable
    from elastictrainer.method.time_model import TimeModel

    table = prun.profile_model(nested_model(), "nested", SIZE, BATCH, CLASSES,
                               num_iterations=2, progress=False, optimizer="adam")
    path = tmp_path_factory.mktemp("table") / "nested.json"
    ptable.save_table(table, str(path))
    return path, TimeModel(table).rho_floor


def test_auto_caches_what_pays_and_says_in_one_line_why_not_otherwise(tmp_path):
    def run(name, **kw):
        lines = []
        summary = loop.run(cfg(tmp_path, name, **kw), log=lines.append,
                           model=nested_model(augment=True), data=data())
        return summary, [m for m in lines if "prefix cache" in m]

    assert config.Config().cache_frozen_prefix == "auto"
    summary, said = run("auto")  # the default: a frozen backbone, 3 epochs, 2 views
    assert summary["prefix_cache"]["served_steps"] == 5
    assert len(said) == 1 and "kept as 2 views of each image" in said[0]
    assert "where an uncached run draws 3 " in said[0] and "--cache_views" in said[0]
    summary, said = run("short", num_epochs=2)
    assert summary["prefix_cache"] is None
    assert said == ["prefix cache off (--cache_frozen_prefix auto): the run's 2 epochs are used "
                    "up by the 2 passes that fill the cache"]
    summary, said = run("one_view", num_epochs=2, cache_views=1)
    assert summary["prefix_cache"]["served_steps"] == 5
    summary, said = run("full", train_type="full_training", num_epochs=1)
    assert summary["prefix_cache"] is None
    assert said == ["prefix cache off (--cache_frozen_prefix auto): full_training trains every "
                    "tensor, so no prefix is frozen"]
    summary, said = run("off", cache_frozen_prefix=False, num_epochs=1)
    assert summary["prefix_cache"] is None and said == []
    # --rho auto's share objective selects the same tensors cached or not: auto keeps the
    # fresh augmentation, true still caches
    summary, said = run("rho_auto", train_type="elastic_training", rho="auto")
    assert summary["prefix_cache"] is None
    assert said == ["prefix cache off (--cache_frozen_prefix auto): --rho auto keeps --rho_share "
                    "of the estimated loss drop cached or not, so the cache would only shorten "
                    "its steps, and it would replay stored augmented views of each image where "
                    "an uncached run draws a fresh one every epoch"]
    summary, said = run("rho_auto_true", train_type="elastic_training", rho="auto",
                        cache_frozen_prefix=True)
    assert summary["prefix_cache"] is not None and "kept as 2 views" in said[0]


def test_auto_leaves_a_distributed_run_uncached_and_says_why():
    from types import SimpleNamespace

    from elastictrainer.runs.setup import _why_uncached

    scheme = SCHEMES["elastic_training"]
    dist = SimpleNamespace(on=True)
    why = _why_uncached(config.Config(strategy="mirrored"), scheme, dist)
    assert why.startswith("--strategy mirrored trains on several replicas")
    assert _why_uncached(config.Config(), scheme, SimpleNamespace(on=False)) is None
    assert _why_uncached(config.Config(cache_frozen_prefix=False), scheme, dist) is None


# -- Keras 3 (`import keras`) functional models, through flavors/keras3.py ---------------


def nested_keras3_model(augment=False, backbone_training=False, dropout=True, seed=0):
    """Input -> [RandomFlip] -> Rescaling -> a nested conv-BN-ReLU backbone (a keras3.Model called
    with training=False, or with no training argument) -> pool -> [dropout] -> dense.  Seeded."""
    keras3.utils.set_random_seed(seed)
    image = keras3.Input((SIZE, SIZE, 3))
    x = keras3.layers.RandomFlip("horizontal", name="flip")(image) if augment else image
    x = keras3.layers.Rescaling(1 / 255.0, name="scale")(x)
    inner = keras3.Input((SIZE, SIZE, 3))
    h = inner
    for i, width in enumerate((8, 12)):
        h = keras3.layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False,
                                name=f"conv{i}")(h)
        h = keras3.layers.BatchNormalization(name=f"bn{i}")(h)
        h = keras3.layers.ReLU(name=f"relu{i}")(h)
    backbone = keras3.Model(inner, h, name="backbone")
    x = backbone(x) if backbone_training is None else backbone(x, training=backbone_training)
    x = keras3.layers.GlobalAveragePooling2D(name="pool")(x)
    if dropout:
        x = keras3.layers.Dropout(0.2, name="dropout")(x)
    return keras3.Model(image, keras3.layers.Dense(CLASSES, name="head")(x), name="nested_k3")


KERAS3_CUTS = ["scale", "conv0", "bn0", "relu0", "conv1", "bn1", "relu1", "pool", "dropout"]


@pytest.mark.parametrize("backbone_training", [False, None])
def test_cut_points_of_a_nested_keras3_model_and_the_sub_models_share_its_weights(
        backbone_training):
    model = nested_keras3_model(backbone_training=backbone_training)
    graph = FlatGraph(model)
    assert graph.why_not is None
    names = [c.name for c in graph.cuts]
    assert names == KERAS3_CUTS  # the backbone is flattened: its layers' outputs are cut points
    relu0 = graph.cuts[names.index("relu0")]
    assert relu0.shape == (8, 8, 8) and relu0.bytes_per_example == 8 * 8 * 8 * 4
    assert 0 < relu0.forward_share < graph.cuts[names.index("scale")].forward_share < 1
    assert graph.cuts[names.index("dropout")].random_prefix == ("dropout",)
    assert list(graph.random_ops) == ["dropout"]
    # conv0, bn0 gamma, beta, conv1, bn1 gamma, beta, head kernel, bias
    tensor_cuts = graph.tensor_cuts(model.trainable_weights)
    assert [names[k] for k in tensor_cuts] == ["scale", "conv0", "conv0", "relu0", "conv1",
                                               "conv1", "dropout", "dropout"]
    prefix, suffix = graph.prefix_model(relu0), graph.suffix_model(relu0)
    assert [id(w) for w in prefix.trainable_weights] == [id(w) for w in
                                                         model.trainable_weights[:3]]
    assert [id(w) for w in suffix.trainable_weights] == [id(w) for w in
                                                         model.trainable_weights[3:]]
    x = tf.random.uniform((3, SIZE, SIZE, 3), 0, 255)
    np.testing.assert_array_equal(suffix(prefix(x, training=False), training=False),
                                  model(x, training=False))


def test_a_nested_backbones_batchnorm_runs_in_the_steps_mode_as_keras3_runs_it():
    """Keras 3 hands the mode a model is called in to every call of its graph, over a nested
    backbone's training=False: the graph must say the backbone's BatchNorm computes batch
    statistics in a training step (so no cut above bn0 qualifies), as Keras does, and
    --bn_mode inference must lift that."""
    model = nested_keras3_model(backbone_training=False)
    bn0 = model.get_layer("backbone").get_layer("bn0")
    before = bn0.moving_mean.numpy().copy()
    model(tf.random.uniform((4, SIZE, SIZE, 3), 0, 255), training=True)
    assert not np.allclose(bn0.moving_mean.numpy(), before)  # Keras ran it in training mode
    graph = FlatGraph(model)
    assert [c.name for c in graph.cuts if not c.batch_prefix] == ["scale", "conv0"]
    assert graph.cuts[KERAS3_CUTS.index("relu1")].batch_prefix == ("bn0", "bn1")
    with batchnorm.mode(model, batchnorm.INFERENCE):
        assert all(not c.batch_prefix for c in FlatGraph(model).cuts)


def test_random_ops_of_keras3_layers_are_found_in_the_traced_prefix():
    """Keras 3's RandomFlip and a Lambda calling tf.random.uniform before the first weights
    are augmentation below every cut; Keras 3's Dropout after them holds back the cuts above
    it only."""
    keras3.utils.set_random_seed(0)
    image = keras3.Input((SIZE, SIZE, 3))
    x = keras3.layers.RandomFlip("horizontal", name="flip")(image)
    x = keras3.layers.Lambda(lambda t: t + tf.random.uniform(tf.shape(t)), name="noise")(x)
    x = keras3.layers.Conv2D(8, 3, name="conv0")(x)
    x = keras3.layers.Dropout(0.5, name="drop")(x)
    x = keras3.layers.GlobalAveragePooling2D(name="pool")(x)
    graph = FlatGraph(keras3.Model(image, keras3.layers.Dense(CLASSES, name="head")(x)))
    assert sorted(graph.random_ops) == ["drop", "flip", "noise"]
    assert "RandomUniform" in graph.random_ops["noise"]
    assert {c.name: (c.augmentation, c.random_prefix) for c in graph.cuts} == {
        "flip": (("flip",), ()), "noise": (("flip", "noise"), ()),
        "conv0": (("flip", "noise"), ()), "drop": (("flip", "noise"), ("drop",)),
        "pool": (("flip", "noise"), ("drop",))}
    # a plain Keras 3 model draws nothing
    assert FlatGraph(nested_keras3_model(dropout=False)).random_ops == {}


@pytest.mark.parametrize("bn_mode", ["inference", "model"])
def test_a_cached_keras3_run_trains_as_the_uncached_one_step_by_step(tmp_path, monkeypatch,
                                                                     bn_mode):
    """The head trains (a fixed selection) under a frozen nested backbone called with
    training=False: with --bn_mode inference the prefix is cached at the pool; in the model's
    mode Keras 3 runs the backbone's BatchNorm on batch statistics, so only below bn0."""
    def run(cached):
        c = cfg(tmp_path, f"r{int(cached)}", cache_frozen_prefix=cached, bn_mode=bn_mode,
                cache_dtype="float32")
        return loop.run(c, log=lambda m: None, model=nested_keras3_model(), data=data())

    plain, _ = losses_of(monkeypatch, lambda: run(False))
    cached, summary = losses_of(monkeypatch, lambda: run(True))
    steps = 3 * EXAMPLES // BATCH
    assert len(plain) == len(cached) == steps
    np.testing.assert_allclose(cached, plain, rtol=2e-5, atol=1e-6)
    pc = summary["prefix_cache"]
    build, = pc["builds"]
    assert build["cut"] == ("pool" if bn_mode == "inference" else "conv0")
    assert build["rows"] == EXAMPLES and build["where"] == "memory"
    assert pc["fill_steps"] == steps // 3 and pc["served_steps"] == 2 * steps // 3
    assert pc["off"] is None


def test_keras3_random_augmentation_is_kept_as_views(tmp_path):
    lines = []
    summary = loop.run(cfg(tmp_path, "views", cache_frozen_prefix=True, bn_mode="inference",
                           cache_views=2),
                       log=lines.append, model=nested_keras3_model(augment=True), data=data())
    pc = summary["prefix_cache"]
    build, = pc["builds"]
    assert build["cut"] == "pool" and pc["served_steps"] > 0
    said = [m for m in lines if m.startswith("prefix cache:")]
    assert len(said) == 1 and "random augmentation (flip (" in said[0]
    assert "kept as 2 views of each image" in said[0]


def test_a_keras3_model_trains_from_the_cache(tmp_path):
    """helpers.keras3_cnn (BatchNorm in the step's mode at the top level): cached below its
    first BatchNorm, the second epoch served from the cache, one line saying so."""
    from helpers import keras3_cnn

    lines = []
    model = keras3_cnn(num_classes=CLASSES)
    # its first conv's name depends on how many Keras 3 layers the process made before
    first_conv = next(layer.name for layer in model.layers if "conv" in layer.name)
    summary = loop.run(cfg(tmp_path, "k3", cache_frozen_prefix=True, num_epochs=2),
                       log=lines.append, model=model, data=data())
    pc = summary["prefix_cache"]
    assert summary["status"] == "finished" and pc["off"] is None
    assert pc["served_steps"] == EXAMPLES // BATCH and pc["fill_steps"] == EXAMPLES // BATCH
    assert [b["cut"] for b in pc["builds"]] == [first_conv]
    assert sum(m.startswith("prefix cache:") for m in lines) == 1
    assert not any("uncached" in m for m in lines)


def test_a_keras3_residual_graph_with_ops_and_a_nested_sequential_is_cut_at_block_outputs():
    """A Keras 3 graph may call operations that are no layers (`keras.ops.add`, `x * y` on its
    tensors; no weights) and nest a keras.Sequential: the cuts are the block outputs, and the
    sub-models at each cut compute the model's output."""
    keras3.utils.set_random_seed(0)
    stem = keras3.Sequential([keras3.Input((SIZE, SIZE, 3)),
                              keras3.layers.Conv2D(8, 3, padding="same", name="stem")],
                             name="stem_seq")
    image = keras3.Input((SIZE, SIZE, 3))
    x = stem(image)
    h = keras3.layers.Conv2D(8, 3, padding="same", name="branch")(x)
    x = keras3.ops.add(x, h * 0.5)  # a residual block's output, made by operations
    x = keras3.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras3.Model(image, keras3.layers.Dense(CLASSES, name="head")(x))
    graph = FlatGraph(model)
    names = [c.name for c in graph.cuts]
    assert names[0] == "stem" and names[-1] == "pool" and "branch" not in names
    assert len(names) == 3  # stem, the add, pool: not the branch or its scaling
    assert all(c.forward_share > 0 for c in graph.cuts)
    x = tf.random.uniform((3, SIZE, SIZE, 3))
    for cut in graph.cuts:
        prefix, suffix = graph.prefix_model(cut), graph.suffix_model(cut)
        np.testing.assert_allclose(suffix(prefix(x)), model(x), rtol=1e-5, atol=1e-5)
    assert [graph.cuts[k].name if k >= 0 else None
            for k in graph.tensor_cuts(model.trainable_weights)] == [
        None, None, "stem", "stem", "pool", "pool"]  # the branch reads the stem's output


def test_a_full_disk_while_writing_the_store_down_turns_the_cache_off_and_the_run_goes_on(
        tmp_path, monkeypatch):
    """Injected OSError (ENOSPC) from the rows file's writes at the first checkpoint: the
    cache turns off, said once, and the run finishes uncached from then on."""
    from elastictrainer.prefix import store as store_module

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "pwrite", full)  # a memory store's rows, written down
    lines = []
    summary = loop.run(cfg(tmp_path, "full", cache_frozen_prefix=True), log=lines.append,
                       model=nested_model(), data=data())
    assert summary["status"] == "finished" and len(summary["epochs"]) == 3
    pc = summary["prefix_cache"]
    assert "writing its store down for the checkpoint failed" in pc["off"]
    assert "No space left on device" in pc["off"]
    assert (pc["fill_steps"], pc["served_steps"], pc["uncached_steps"]) == (5, 0, 10)
    assert sum("the prefix cache is off" in m for m in lines) == 1
