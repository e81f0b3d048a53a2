"""Timing tables reused within one process (profiler/reuse.py): a second run of the same model
and shapes does not profile again, wherever its table path; another shape, optimizer or
architecture does."""
import json
import os

import pytest

from helpers import batch, keras3_cnn, scripted_table, tiny_model
from elastictrainer.profiler import reuse, run as prun


@pytest.fixture
def profiled(monkeypatch, tmp_path):
    """profile_model replaced by a scripted table: the calls it got, by (input, batch, opt)."""
    calls = []

    def fake(model, model_name, input_size, batch_size, num_classes, optimizer="sgd", **kw):
        calls.append((input_size, batch_size, optimizer))
        path = scripted_table(model, tmp_path / f"scripted_{len(calls)}.json", input_size,
                              batch_size, optimizer)
        with open(path) as f:
            return dict(json.load(f), model=model_name, profiling_phases_s={"setup": 0.0})

    monkeypatch.setattr(prun, "profile_model", fake)
    return calls


def _load(tmp_path, name, model, input_size=16, batch_size=4, optimizer="sgd"):
    said = []
    table = prun.load_or_profile(str(tmp_path / name), model, "tiny", input_size, batch_size,
                                 10, optimizer=optimizer, in_child=False, log=said.append)
    return table, said


def test_a_second_run_of_the_same_model_in_the_process_does_not_profile(tmp_path, profiled):
    first, _ = _load(tmp_path, "a.json", tiny_model())
    again = tiny_model()  # built again: Keras names its layers anew
    table, said = _load(tmp_path, "b.json", again)
    assert len(profiled) == 1
    assert "reusing the one profiled in this process" in said[0]
    assert os.path.exists(tmp_path / "b.json")  # written where the run looks for it
    assert [t["name"] for t in table["tensors"]] == [v.name for v in again.trainable_weights]
    assert [t["t_dw_ms"] for t in table["tensors"]] == [t["t_dw_ms"] for t in first["tensors"]]


def test_another_shape_optimizer_or_architecture_profiles_again(tmp_path, profiled):
    _load(tmp_path, "a.json", tiny_model())
    _load(tmp_path, "b.json", tiny_model(), batch_size=8)
    _load(tmp_path, "c.json", tiny_model(size=24), input_size=24)
    _load(tmp_path, "d.json", tiny_model(), optimizer="adam")
    _load(tmp_path, "e.json", tiny_model(num_classes=10, size=16), batch_size=8)  # as b
    assert profiled == [(16, 4, "sgd"), (16, 8, "sgd"), (24, 4, "sgd"), (16, 4, "adam")]
    reuse.forget()
    _load(tmp_path, "f.json", tiny_model())
    assert len(profiled) == 5


def test_the_fingerprint_is_the_architecture_not_the_names():
    import keras

    a, b = tiny_model(), tiny_model()
    assert a.name != b.name and reuse.model_fingerprint(a) == reuse.model_fingerprint(b)
    # the same tensors' shapes, other layers or another activation
    assert reuse.model_fingerprint(keras3_cnn(5)) != reuse.model_fingerprint(keras3_cnn(5, augment=True))
    d = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="tanh")])
    e = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu")])
    assert reuse.model_fingerprint(d) != reuse.model_fingerprint(e)
    frozen = tiny_model()
    frozen.get_layer("c1").trainable = False
    assert reuse.model_fingerprint(frozen) != reuse.model_fingerprint(a)


def test_the_key_names_the_optimizer_and_loss_by_kind_not_by_name_or_rate():
    import keras

    one = reuse.describe(keras.optimizers.Adam(1e-3, name="a"))
    assert one == reuse.describe(keras.optimizers.Adam(5e-2, name="b"))
    assert one != reuse.describe(keras.optimizers.Adam(1e-3, amsgrad=True))
    assert one != reuse.describe(keras.optimizers.SGD(1e-3))
    assert reuse.describe(keras.losses.SparseCategoricalCrossentropy(from_logits=True)) != \
        reuse.describe(keras.losses.SparseCategoricalCrossentropy())


def test_model_fit_runs_in_one_process_profile_once_per_model_and_batch(tmp_path, monkeypatch):
    """Two ElasticCallback runs with profile folders of their own: the second reuses the
    first's table; a run of another batch size profiles."""
    import keras
    import tensorflow as tf

    from elastictrainer.fit.callback import ElasticCallback

    real, calls = prun.profile_model, []

    def counted(*args, **kwargs):
        calls.append(args[3])  # the batch size
        return real(*args, num_iterations=1, warmup=1, **kwargs)

    monkeypatch.setattr(prun, "profile_model", counted)
    x, y = batch(n=64, size=16, num_classes=5)

    def fit(name, batch_size):
        keras.utils.set_random_seed(0)
        model = keras3_cnn(5)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        said = []
        callback = ElasticCallback(rho=1.0, economy=False, logdir=str(tmp_path / name),
                                   profiles=str(tmp_path / f"profiles_{name}"), log=said.append)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
        model.fit(data, epochs=1, verbose=0, callbacks=[callback])
        return said

    fit("first", 16)
    said = fit("second", 16)
    assert calls == [16]
    assert any("reusing the one profiled in this process" in line for line in said)
    assert os.listdir(tmp_path / "profiles_second")
    fit("third", 8)
    assert calls == [16, 8]


@pytest.fixture
def skipping(monkeypatch, tmp_path):
    """profile_model replaced by a scripted table that skips calibration when told the run's
    steps, as a short --rho auto run's first profiling does: the run_steps of each call."""
    calls = []

    def fake(model, model_name, input_size, batch_size, num_classes, optimizer="sgd",
             run_steps=None, **kw):
        calls.append(run_steps)
        path = scripted_table(model, tmp_path / f"scripted_{len(calls)}.json", input_size,
                              batch_size, optimizer if isinstance(optimizer, str) else "adam")
        with open(path) as f:
            return dict(json.load(f), model=model_name, profiling_phases_s={"setup": 0.0},
                        calibration_skipped="too short" if run_steps else None)

    monkeypatch.setattr(prun, "profile_model", fake)
    return calls


@pytest.mark.parametrize("rho,feedback", [("auto", True), ("auto", False), (0.7, True)])
def test_a_rho_auto_runs_first_profiling_is_given_its_steps_while_its_closed_loop_corrects(
        tmp_path, skipping, rho, feedback):
    """Under --rho auto, the command line's run and model.fit's tell their first profiling how
    many steps they train (profile_model calibrates only when those steps pay for it).  With
    --rho_feedback false nothing corrects the time model, and a numeric rho is a step ratio the
    run promises: they give none, and it calibrates."""
    import keras
    import tensorflow as tf

    from helpers import image_data
    from elastictrainer import config
    from elastictrainer.fit.callback import ElasticCallback
    from elastictrainer.runs import loop

    cfg = config.Config(train_type="elastic_training", optimizer="adam", learning_rate=0.01,
                        num_epochs=2, rho=rho, rho_feedback=feedback, logdir=str(tmp_path),
                        run_name="cli", progress=False, energy="none",
                        cache_frozen_prefix=False, timing_table=str(tmp_path / "cli.json"))
    loop.run(cfg, log=lambda line: None, model=tiny_model(), data=image_data(40, 16, 4, 8))
    x, y = batch(n=32, size=16, num_classes=5)
    model = keras3_cnn(5)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = ElasticCallback(rho=rho, rho_feedback=feedback, cache_frozen_prefix=False,
                               logdir=str(tmp_path / "fit"), profiles=str(tmp_path / "profiles"),
                               log=lambda line: None)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=3, verbose=0,
              callbacks=[callback])
    assert skipping == ([5 * 2, 4 * 3] if rho == "auto" and feedback else [None, None])


def test_a_table_that_skipped_calibration_is_profiled_again_for_a_run_that_needs_one(
        tmp_path, skipping):
    """A --rho auto run's first profiling may skip calibration; a numeric-rho run (told no
    steps) that finds that table, on disk or in this process, profiles again and says why; a
    --rho auto run uses it as it is, and so does every run once it is calibrated."""
    def load(name, run_steps):
        said = []
        table = prun.load_or_profile(str(tmp_path / name), tiny_model(), "tiny", 16, 4, 10,
                                     in_child=False, log=said.append, run_steps=run_steps)
        return table, said

    table, _ = load("a.json", 100)
    assert skipping == [100] and table["calibration_skipped"] == "too short"
    load("a.json", 50)  # another auto run: the skipped table serves it
    load("b.json", 50)  # ... and from this process's reuse
    assert skipping == [100]
    table, said = load("a.json", None)  # a numeric rho finds it on disk
    assert skipping == [100, None] and table["calibration_skipped"] is None
    assert "cannot be used" in said[0] and "skipped calibration (too short)" in said[0]
    assert "profiling this configuration again" in said[0]
    table, said = load("c.json", None)  # the calibrated one is now this process's to reuse
    assert skipping == [100, None] and table["calibration_skipped"] is None
    assert "reusing the one profiled in this process" in said[0]


def test_a_skipped_in_process_table_is_not_reused_by_a_numeric_rho_run(tmp_path, skipping):
    prun.load_or_profile(str(tmp_path / "a.json"), tiny_model(), "tiny", 16, 4, 10,
                         in_child=False, log=lambda line: None, run_steps=100)
    said = []
    table = prun.load_or_profile(str(tmp_path / "b.json"), tiny_model(), "tiny", 16, 4, 10,
                                 in_child=False, log=said.append)
    assert skipping == [100, None] and table["calibration_skipped"] is None
    assert said[0].startswith(f"no timing table at {tmp_path / 'b.json'}: profiling")


def test_model_fit_profiles_again_when_a_numeric_rho_finds_a_skipped_table(tmp_path, skipping):
    import keras
    import tensorflow as tf

    from elastictrainer.fit.callback import ElasticCallback

    x, y = batch(n=32, size=16, num_classes=5)

    def fit(rho):
        model = keras3_cnn(5)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        said = []
        callback = ElasticCallback(rho=rho, cache_frozen_prefix=False, economy=False,
                                   logdir=str(tmp_path / f"fit_{rho}"),
                                   profiles=str(tmp_path / "profiles"), log=said.append)
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0,
                  callbacks=[callback])
        return said

    fit("auto")
    said = fit(0.9)
    assert skipping == [4 * 2, None]
    assert any("cannot be used" in line and "skipped calibration" in line for line in said)
    fit(0.8)  # the table on disk is calibrated now
    assert skipping == [4 * 2, None]
