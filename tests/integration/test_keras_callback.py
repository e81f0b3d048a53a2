"""ElasticCallback (elastictrainer/fit/callback.py): ElasticTrainer inside model.fit, for Keras 3 and
tf-keras models, with the optimizer the model was compiled with, next to Keras' own callbacks."""
import inspect
import json
import os
import warnings

import numpy as np
import pytest

import tensorflow as tf

from helpers import keras3_cnn, scripted_table, tiny_model
from elastictrainer import config, runlog
from elastictrainer.errors import UserError
from elastictrainer.flavors import batchnorm
from elastictrainer.profiler import table as ptable
from elastictrainer.fit.callback import MEASURED_RATIO_LOG, SELECTED_LOG, ElasticCallback
from elastictrainer.fit.persist import STATE_FILE


# on TensorFlow 2.16 too: what runs through Keras' own fit, callbacks, BatchNorm and saving, in
# each flavour (the callback's own logic, rho auto and its refusals, is not version-bound)
VERSIONS = pytest.mark.tf_versions


def _keras(flavor):
    if flavor == "keras3":
        import keras
    else:
        import tf_keras as keras
    return keras


def _model(flavor, num_classes=5):
    keras = _keras(flavor)
    keras.utils.set_random_seed(0)
    return keras3_cnn(num_classes) if flavor == "keras3" else tiny_model(num_classes)


def _data(n_train=192, n_test=64, classes=5, batch=16):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (n_train + n_test, 16, 16, 3)).astype("float32")
    y = rng.integers(0, classes, n_train + n_test).astype("int32")
    train = tf.data.Dataset.from_tensor_slices((x[:n_train], y[:n_train])).shuffle(
        n_train, seed=0).batch(batch)
    test = tf.data.Dataset.from_tensor_slices((x[n_train:], y[n_train:])).batch(batch)
    return train, test


def _optimizer(flavor, kind):
    keras = _keras(flavor)
    return {"sgd": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(1e-3),
            "adamw": lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.01)}[kind]()


def _compile(model, flavor, kind="adam"):
    keras = _keras(flavor)
    model.compile(optimizer=_optimizer(flavor, kind),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _callback(tmp_path, name="run", **kw):
    kw.setdefault("rho", 0.7)
    kw.setdefault("economy", False)  # a few dozen steps: the economy would train them all
    return ElasticCallback(interval=1, logdir=str(tmp_path / "logs" / name),
                           profiles=str(tmp_path / "profiles"), log=None, **kw)


# Scripted times: the table's forward pass is 30 ms of a 100 ms step and its backward 70 ms,
# shared evenly among the tensors, so that under rho 0.7 (a 40 ms backward budget) a selection
# trains some tensors and never all; the clock makes every probe and full step FULL_S long and
# every selection step SELECTION_RATIO of it (within the closed loop's 5% of rho: no correction).
FULL_S, SELECTION_RATIO = 0.1, 0.68


def _scripted_table(tmp_path, model, batch=16):
    optimizer = type(model.optimizer).__name__.lower()
    return scripted_table(model, tmp_path / f"{model.name}_{optimizer}.json", 16, batch,
                          optimizer)


class _StepClock:
    """Seconds that advance, at each reading, by the scripted time of the step the callback's
    runtime is on (ElasticDriver.ran)."""

    def __init__(self):
        self.now, self.callback = 0.0, None

    def __call__(self):
        driver = getattr(self.callback, "driver", None)
        kind = driver.ran[0] if driver is not None and driver.ran else None
        self.now += FULL_S * (SELECTION_RATIO if kind == "selection" else 1.0)
        return self.now


def _scripted_callback(tmp_path, model, name="run", **kw):
    # uncached: the clock scripts whole steps, and a cache's fills would read it inside them
    # (the fit's cache: test_fit_prefix_cache.py)
    kw.setdefault("cache_frozen_prefix", False)
    clock = _StepClock()
    clock.callback = _callback(tmp_path, name, timing_table=_scripted_table(tmp_path, model),
                               clock=clock, **kw)
    return clock.callback


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
@pytest.mark.parametrize("kind", [pytest.param("sgd", marks=VERSIONS), "adam", "adamw"])
def test_fit_trains_only_the_selected_tensors(tmp_path, flavor, kind):
    model = _compile(_model(flavor), flavor, kind)
    before = [v.numpy().copy() for v in model.trainable_weights]
    train, test = _data()
    history = model.fit(train, epochs=3, validation_data=test, verbose=0,
                         callbacks=[_scripted_callback(tmp_path, model)])
    out = tmp_path / "logs" / "run"
    summary = runlog.read_summary(str(out))
    assert summary["status"] == "finished" and len(summary["epochs"]) == 3
    ever = np.any([r["mask"] for r in summary["selections"]], axis=0)
    assert 0 < ever.sum() < len(before)  # the table leaves room for some tensors, not all
    for trained, a, v in zip(ever, before, model.trainable_weights):
        if trained:
            assert not np.array_equal(a, v.numpy())
        else:
            np.testing.assert_array_equal(a, v.numpy())  # never selected: never moved
    # what its clock measured (selection steps against the run's full steps) is in history as
    # well as in summary.json
    ratios = history.history[MEASURED_RATIO_LOG]
    assert len(ratios) == 3 and ratios[-1] == pytest.approx(SELECTION_RATIO)
    assert summary["measured_ratio"] == pytest.approx(SELECTION_RATIO)
    assert not summary["corrections"]
    assert history.history[SELECTED_LOG][-1] == sum(summary["selections"][-1]["mask"])
    assert summary["epochs"][-1]["test_accuracy"] == pytest.approx(
        100 * history.history["val_accuracy"][-1])
    config = json.load(open(out / runlog.CONFIG_FILE))
    assert config["rho"] == 0.7 and config["optimizer"] == kind
    acc = runlog.open_events(str(out))
    assert runlog.NUM_SELECTED in acc.Tags()["tensors"]
    assert runlog.TEST_ACCURACY in acc.Tags()["tensors"]


@VERSIONS
@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_it_composes_with_keras_callbacks(tmp_path, flavor):
    """ModelCheckpoint, EarlyStopping and TensorBoard beside it: each does its job and the
    elastic run ends with its summary."""
    keras = _keras(flavor)
    model = _compile(_model(flavor), flavor)
    train, test = _data()
    ckpt = str(tmp_path / "best.weights.h5")
    model.fit(train, epochs=6, validation_data=test, verbose=0, callbacks=[
        _scripted_callback(tmp_path, model),
        keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0),
        keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))])
    summary = runlog.read_summary(str(tmp_path / "logs" / "run"))
    assert summary["status"] == "finished"
    assert len(summary["epochs"]) == 2  # EarlyStopping: no epoch improves the loss by 10
    assert os.path.exists(ckpt)
    assert any(f.startswith("events") for _, _, fs in os.walk(tmp_path / "tb") for f in fs)


@VERSIONS
@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_backup_and_restore_resumes_the_elastic_runtime(tmp_path, flavor):
    """A fit that dies at epoch 3 and is started again with BackupAndRestore continues from
    epoch 3: the runtime's selections, step count and summary go on from where they were."""
    keras = _keras(flavor)

    class Crash(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("power cut")

    train, test = _data()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    model = _compile(_model(flavor), flavor)
    with pytest.raises(RuntimeError, match="power cut"):
        model.fit(train, epochs=4, validation_data=test, verbose=0,
                  callbacks=[_scripted_callback(tmp_path, model), backup, Crash()])
    saved = json.load(open(tmp_path / "logs" / "run" / STATE_FILE))
    assert saved["epoch"] == 2
    said = []
    model = _compile(_model(flavor), flavor)
    callback = _scripted_callback(tmp_path, model)
    callback.log = said.append
    # BackupAndRestore first: it restores into the optimizer as the elastic run trains it
    # (per-tensor Adam counts included), whatever the order
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(train, epochs=4, validation_data=test, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "backup")), callback])
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    assert any("resuming the elastic runtime at epoch 2" in line for line in said)
    summary = runlog.read_summary(str(tmp_path / "logs" / "run"))
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2, 3, 4]
    steps = [r["step"] for r in summary["selections"]]
    assert steps == sorted(steps) and steps[-1] >= 2 * 12  # selections continue past epoch 2


@VERSIONS
def test_the_profile_is_made_once_per_model_and_batch_shape(tmp_path):
    model = _compile(_model("keras3"), "keras3")
    train, test = _data()
    said = []
    callback = _callback(tmp_path, rho=1.0)  # above any forward floor the profile may find
    callback.log = said.append
    model.fit(train, epochs=1, verbose=0, callbacks=[callback])
    assert sum("profiling k3cnn on this batch first" in line for line in said) == 1
    tables = os.listdir(tmp_path / "profiles")
    assert len(tables) == 1 and tables[0].startswith("k3cnn-")
    # the run waited for its profiling, which full training would not have: it is counted
    first = json.loads((tmp_path / "logs" / "run" / "summary.json").read_text())
    assert first["profiling_s"] > 0
    assert f"its {first['profiling_s']:.1f} s of profiling the timing table included" in said[-1]
    # the same logdir again (a script run twice): refused before the fit trains a step, which
    # leaves the finished run's files and the model's own train function as they were
    files = sorted(os.listdir(tmp_path / "logs" / "run"))
    keras_own = model.train_function
    with pytest.raises(UserError, match=r"logs/run already holds a finished run; pass another "
                                        r"logdir, or remove it to run again$"):
        model.fit(train, epochs=1, verbose=0, callbacks=[_callback(tmp_path, rho=1.0)])
    assert sorted(os.listdir(tmp_path / "logs" / "run")) == files
    assert model.train_function is keras_own
    said.clear()
    again = _compile(_model("keras3"), "keras3")
    callback = _callback(tmp_path, name="again", rho=1.0)
    callback.log = said.append
    again.fit(train, epochs=1, verbose=0, callbacks=[callback])
    assert not any("profiling" in line for line in said)  # the same tensors: cached
    assert os.listdir(tmp_path / "profiles") == tables
    assert json.loads((tmp_path / "logs" / "again" / "summary.json").read_text())[
        "profiling_s"] == 0.0


def test_its_defaults_are_configs():
    params = inspect.signature(ElasticCallback).parameters
    for name in config.FIT_CONFIG_FIELDS:
        assert params[name].default == config.CONFIG_FIELDS[name].default, name
    assert params["logdir"].default == config.FIT_LOGDIR
    assert params["profiles"].default == ptable.PROFILE_DIR
    # every other argument is the callback's wiring, not a setting
    assert set(params) - set(config.FIT_CONFIG_FIELDS) == {"logdir", "profiles", "log", "clock"}
    cfg = ElasticCallback(log=None).cfg
    assert {n: getattr(cfg, n) for n in config.FIT_CONFIG_FIELDS} == {
        n: getattr(config.Config(), n) for n in config.FIT_CONFIG_FIELDS}


def test_bad_use_is_refused_in_one_line(tmp_path):
    import keras
    train, _ = _data()
    with pytest.raises(UserError, match="fixed one"):
        ElasticCallback(train_type="full_training")
    with pytest.raises(UserError, match="rho"):
        ElasticCallback(rho=1.5)
    # Config's errors in the callback's words: its keyword arguments, not the command line's
    # flags
    with pytest.raises(UserError,
                       match="^unknown bn_mode 'train'; valid: model, inference, frozen$"):
        ElasticCallback(bn_mode="train")
    with pytest.raises(UserError, match=r"^rho_share is a share of the estimated loss drop"):
        ElasticCallback(rho="auto", rho_share=1.5)
    with pytest.raises(UserError, match="^rho_objective gain chooses rho auto's") as refused:
        ElasticCallback(rho=0.5, rho_objective="gain")
    assert "--" not in str(refused.value)
    with pytest.raises(UserError, match=r"^rho_share must be a number, got 'most'$"):
        ElasticCallback(rho="auto", rho_share="most")
    with pytest.raises(UserError, match=r"^probe_batches must be an integer, got None$"):
        ElasticCallback(probe_batches=None)
    model = _model("keras3")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True),
                  steps_per_execution=4)
    with pytest.raises(UserError, match="steps_per_execution=1"):
        model.fit(train, epochs=1, verbose=0, callbacks=[_callback(tmp_path)])
    model = _compile(_model("keras3"), "keras3")

    def batches():  # a generator: fit cannot know the epoch's length
        yield from train

    with pytest.raises(UserError, match="steps_per_epoch"):
        model.fit(batches(), epochs=1, verbose=0, callbacks=[_callback(tmp_path)])
    # an update the in-step importance does not cover: refused before profiling the model
    model = _model("keras3")
    model.compile(optimizer=keras.optimizers.SGD(0.01, clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(True))
    with pytest.raises(UserError, match="SGD with these settings is not covered$"):
        model.fit(train, epochs=1, verbose=0, callbacks=[_callback(tmp_path, name="clipped")])
    assert not (tmp_path / "profiles").exists() and not (tmp_path / "logs" / "clipped").exists()


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
@pytest.mark.parametrize("bn_mode", ["model", pytest.param("inference", marks=VERSIONS)])
def test_bn_mode_inference_holds_the_moving_statistics_through_the_fit(tmp_path, flavor,
                                                                       bn_mode):
    """Probes, full steps and selections all run the model in training mode: BatchNorm's moving
    statistics move, unless bn_mode="inference", which the fit's end undoes."""
    model = _compile(_model(flavor), flavor)
    layers = batchnorm.batch_norm_layers(model)
    n = len(layers)
    assert n == (2 if flavor == "keras3" else 1)
    means = [layer.moving_mean.numpy().copy() for layer in layers]
    train, test = _data()
    lines = []
    callback = _scripted_callback(tmp_path, model, bn_mode=bn_mode)
    callback.log = lines.append
    model.fit(train, epochs=2, validation_data=test, verbose=0, callbacks=[callback])
    out = tmp_path / "logs" / "run"
    assert runlog.read_summary(str(out))["status"] == "finished"
    assert json.load(open(out / runlog.CONFIG_FILE))["bn_mode"] == bn_mode
    moved = [not np.array_equal(m, layer.moving_mean.numpy()) for m, layer in zip(means, layers)]
    assert moved == [bn_mode == "model"] * n
    said = [line for line in lines if line.startswith("--bn_mode")]
    assert said == ([] if bn_mode == "model" else [
        f"--bn_mode inference: 2 BatchNorm layers of {model.name} normalise with their "
        f"moving statistics, which stay unchanged" if n == 2 else
        f"--bn_mode inference: 1 BatchNorm layer of {model.name} normalises with its moving "
        f"statistics, which stay unchanged"])
    assert not any(batchnorm.in_inference(layer) for layer in layers)


@pytest.mark.parametrize("flavor,objective", [("keras3", "share"), ("tf_keras", "rate")])
def test_rho_auto_in_model_fit(tmp_path, flavor, objective):
    """ElasticCallback(rho="auto"): each selection the cheapest keeping rho_share of the
    estimated loss drop (or, rho_objective="rate", the one of the most per second of step),
    its ratio and why in summary.json; a bad rho is one line."""
    model = _compile(_model(flavor), flavor)
    train, test = _data()
    lines = []
    callback = _scripted_callback(tmp_path, model, rho="auto", rho_share=0.5,
                                  rho_objective=objective)
    callback.log = lines.append
    model.fit(train, epochs=2, validation_data=test, verbose=0, callbacks=[callback])
    summary = runlog.read_summary(str(tmp_path / "logs" / "run"))
    # the default head warm-up first (the output layer's tensors alone), then the selections
    warmup, *selections = summary["selections"]
    assert warmup["reason"] == "head warm-up" and warmup["steps"] >= 1
    assert warmup["mask"] == [0] * (len(warmup["mask"]) - 2) + [1, 1]
    assert summary["rho"] == "auto" and selections
    for s in selections:
        importance, mask = np.asarray(s["importance"]), np.asarray(s["mask"], bool)
        assert s["limited_by"] == objective and s["objective"] == objective
        assert s["rho"] == pytest.approx(s["predicted_ratio"])
        kept = importance[mask].sum() / importance[importance > 0].sum()
        assert s["importance_share"] == pytest.approx(kept)
        if objective == "share":
            assert kept >= 0.5 * (1 - 1e-9)
        elif s["runner_up"] is not None:
            assert s["runner_up"]["rate"] <= s["rate"] * (1 + 1e-9)
    said = "asked auto (50% of the estimated loss drop)" if objective == "share" else \
        "asked auto (the most estimated loss drop per second of step)"
    assert any(said in line for line in lines)
    assert any(line.startswith(f"rho auto ({objective}") for line in lines)
    # the recorder every driver writes through: TensorBoard's heat map, text and HParams too
    events = runlog.open_events(str(tmp_path / "logs" / "run"))
    tags = set(events.Tags()["tensors"]) | set(events.Tags()["scalars"])
    assert {runlog.SELECTION_IMAGE, runlog.CONFIG_TEXT, runlog.RESULT_TEXT,
            runlog.BEST_ACCURACY, runlog.SELECTION_RHO, runlog.SELECTION_IMPORTANCE_SHARE} <= tags
    with pytest.raises(UserError, match="rho must be a number"):
        ElasticCallback(rho="fast")
    with pytest.raises(UserError, match="cache_frozen_prefix must be auto, true or false"):
        ElasticCallback(cache_frozen_prefix="sometimes")
    # the command line's spellings
    no = ElasticCallback(logdir=str(tmp_path / "no"), cache_frozen_prefix="no")
    assert no.cfg.cache_frozen_prefix is False
    assert ElasticCallback(logdir=str(tmp_path / "auto"),
                           cache_frozen_prefix="AUTO").cfg.cache_frozen_prefix == "auto"


def test_its_economy_lines_name_the_callbacks_own_argument(tmp_path):
    """A fit too short to pay for a selection's compile trains every tensor, and says how to
    select anyway in model.fit's words (economy=False), not the command line's."""
    model = _compile(_model("keras3"), "keras3")
    train, _ = _data()
    lines = []
    callback = _callback(tmp_path, rho=0.99, economy=True, cache_frozen_prefix=False,
                         timing_table=_scripted_table(tmp_path, model))
    callback.log = lines.append
    model.fit(train, epochs=1, verbose=0, callbacks=[callback])
    said = "\n".join(lines)
    assert "(economy=False to select anyway)" in said and "--economy" not in said
    summary = runlog.read_summary(str(tmp_path / "logs" / "run"))
    assert summary["economy"]["choice"] == "full training"
