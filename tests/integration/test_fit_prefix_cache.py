"""The frozen-prefix cache in model.fit (ElasticCallback with fit/steps.py's FitSteps, on
prefix/cache.py's one runtime): a selection's cached fit step trains as its uncached one, a fit
caches by default, and a dataset that outgrows the store turns the cache off with a warning
while the fit goes on."""
import json
import os

import numpy as np
import pytest

from helpers import flat_cnn, image_data, scripted_table
from elastictrainer import config, runlog
from elastictrainer.fit.callback import MEASURED_RATIO_LOG, ElasticCallback
from elastictrainer.fit.persist import STATE_FILE
from elastictrainer.fit.steps import FitSteps, parts
from elastictrainer.flavors import optimizers
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.prefix import plan as prefix_plan
from elastictrainer.prefix.store import CACHE_DIR

EXAMPLES, BATCH, CLASSES = 48, 8, 5


def _keras(flavor):
    return __import__("keras") if flavor == "keras3" else __import__("tf_keras")


def _compiled(flavor, seed=0):
    keras = _keras(flavor)
    model = flat_cnn(keras, CLASSES, seed=seed)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _train(examples=EXAMPLES, seed=0):
    return image_data(examples, 16, CLASSES, BATCH, seed)[0]


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_a_cached_fit_step_trains_as_the_uncached_one_step_by_step(tmp_path, flavor):
    """conv1 and the head train (a fixed selection, its cut below conv1) for three epochs:
    the cached steps' losses, Keras logs and weights are the uncached steps' own."""
    plain_model, cached_model = _compiled(flavor), _compiled(flavor)
    cfg = config.Config(cache_frozen_prefix=True, num_epochs=3, batch_size=BATCH)
    cache = prefix_plan.plan(cached_model, list(cached_model.trainable_weights), cfg, EXAMPLES,
                             str(tmp_path / "run"), log=lambda m: None)
    steps = []
    for model, c in ((plain_model, None), (cached_model, cache)):
        optimizers.prepare_optimizer(model.optimizer, model.trainable_weights)
        steps.append(FitSteps(model, model.optimizer, SCHEMES["elastic_training"].importance,
                              prefix_cache=c))
    n = len(plain_model.trainable_weights)
    selection = tuple(range(n - 4, n))  # conv1's kernel and bias, the head's
    assert cache.cuts[cache.cut_of(selection)].name == "conv0"
    batches = [b for _ in range(3) for b in _train()]
    for batch in batches:
        (loss_a, logs_a), (loss_b, logs_b) = (
            s.step_for(selection)(*parts(batch)) for s in steps)
        np.testing.assert_allclose(loss_b.numpy(), loss_a.numpy(), rtol=2e-5, atol=1e-6)
        for key in logs_a:
            np.testing.assert_allclose(float(logs_b[key]), float(logs_a[key]), rtol=2e-5,
                                       atol=1e-6, err_msg=key)
    for a, b in zip(plain_model.trainable_weights, cached_model.trainable_weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-6)
    per_epoch = EXAMPLES // BATCH
    assert (cache.fill_steps, cache.served_steps) == (per_epoch, 2 * per_epoch)


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_a_fit_below_the_uncached_forward_floor_trains_from_the_cache_by_default(tmp_path,
                                                                                  flavor):
    """The table's forward pass is 40% of a step: rho 0.3 fits only selections with their
    prefix cached, which the fit's default (auto) gives; conv0, below every cut, stays put."""
    model = _compiled(flavor)
    conv0 = [v.numpy().copy() for v in model.get_layer("conv0").trainable_weights]
    table = scripted_table(model, tmp_path / "table.json", 16, BATCH,
                           type(model.optimizer).__name__.lower(), t_fp_ms=40.0)
    lines = []
    out = tmp_path / "logs" / "fit"
    history = model.fit(_train(), epochs=4, verbose=0, callbacks=[ElasticCallback(
        rho=0.3, interval=1, logdir=str(out), timing_table=table, economy=False,
        rho_feedback=False, log=lines.append)])
    assert any(line.startswith("prefix cache: ") and "cut points for 48 examples" in line
               for line in lines), lines
    summary = runlog.read_summary(str(out))
    pc = summary["prefix_cache"]
    assert pc["policy"] == "deterministic prefix" and pc["off"] is None
    assert pc["served_steps"] > 0 and pc["fill_steps"] > 0 and pc["uncached_steps"] == 0
    assert all(r["cut"] for r in summary["selections"])
    for before, v in zip(conv0, model.get_layer("conv0").trainable_weights):
        np.testing.assert_array_equal(before, v.numpy())
    # the storing is booked apart from the steps measured: a run whose every re-selection's
    # probes leave images unstored still has a measured ratio
    assert not np.isnan(history.history[MEASURED_RATIO_LOG][-1])
    assert summary["measured_ratio"] is not None
    assert not os.path.exists(out / CACHE_DIR)  # the store goes with the fit


def test_a_dataset_with_more_images_than_an_epoch_turns_the_cache_off_and_fit_goes_on(
        tmp_path):
    """steps_per_epoch covers a third of a repeated dataset: the second epoch brings images the
    store has no room for.  One warning; the fit trains its epochs uncached."""
    model = _compiled("keras3")
    table = scripted_table(model, tmp_path / "table.json", 16, BATCH, "sgd", t_fp_ms=40.0)
    lines = []
    out = tmp_path / "logs" / "fit"
    history = model.fit(_train(3 * EXAMPLES).repeat(), epochs=3, steps_per_epoch=EXAMPLES // BATCH,
                        verbose=0, callbacks=[ElasticCallback(
                            rho=0.3, interval=1, logdir=str(out), timing_table=table,
                            economy=False, rho_feedback=False, log=lines.append)])
    assert len(history.history["loss"]) == 3
    warnings = [line for line in lines if line.startswith("warning: --cache_frozen_prefix")]
    pc = runlog.read_summary(str(out))["prefix_cache"]
    assert len(warnings) == 1 and "more distinct images than its 48 examples" in warnings[0]
    assert "more distinct images" in pc["off"] and pc["uncached_steps"] > 0


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_a_fit_restarted_by_backup_and_restore_puts_its_store_back(tmp_path, flavor):
    """A cached fit that dies at the start of epoch 3 (after epoch 2's state was written) and
    is started again with BackupAndRestore reads the prefix cache's store back with the
    runtime: no image is stored twice (the fill steps are the uninterrupted fit's), the same
    one store serves the rest, and its files go at the end."""
    keras = _keras(flavor)

    class Crash(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("power cut")

    def fit(name, *extra, log=lambda m: None):
        model = _compiled(flavor)
        table = scripted_table(model, tmp_path / "table.json", 16, BATCH,
                               type(model.optimizer).__name__.lower(), t_fp_ms=40.0)
        callback = ElasticCallback(rho=0.3, interval=10, logdir=str(tmp_path / name),
                                   timing_table=table, economy=False, rho_feedback=False,
                                   log=log)
        model.fit(_train(), epochs=4, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / f"{name}-backup")), callback,
            *extra])
        return runlog.read_summary(str(tmp_path / name))["prefix_cache"]

    whole = fit("whole")
    with pytest.raises(RuntimeError, match="power cut"):
        fit("restarted", Crash())
    assert any(f.endswith(".bin") for f in os.listdir(tmp_path / "restarted" / CACHE_DIR))
    with open(tmp_path / "restarted" / STATE_FILE) as f:
        left = json.load(f)["prefix_cache"]
    stored = left["builds"][-1]["rows"]
    assert 0 < stored < EXAMPLES  # the probes' and timed full steps' batches store nothing
    said = []
    again = fit("restarted", log=said.append)
    assert any("resuming the elastic runtime at epoch 2" in line for line in said)
    assert not any("cannot be put back" in line for line in said)
    # only the images not stored before the crash are stored after it (at least one a step)
    fills_after = again["fill_steps"] - left["stats"][1]
    assert 0 < fills_after <= EXAMPLES - stored
    assert again["builds"][-1]["rows"] == whole["builds"][-1]["rows"] == EXAMPLES
    assert len(again["builds"]) == len(whole["builds"]) == 1  # put back, not made again
    assert again["served_steps"] > 0
    assert not os.path.exists(tmp_path / "restarted" / CACHE_DIR)
