"""scripts/bench_fixed_selection.py: its fixed scheme trains exactly tensor k to the output, and
its table's gaps are full training's accuracy minus each run's."""
import numpy as np
import pytest
import tensorflow as tf

from helpers import load_script, snapshot, tiny_model


def _script():
    return load_script("bench_fixed_selection")


@pytest.fixture
def own_schemes():
    """The scheme registry restored after the test: later tests see the built-in schemes only
    (the README's flag table lists them)."""
    from elastictrainer.schemes import SCHEMES

    saved = dict(SCHEMES)
    yield SCHEMES
    SCHEMES.clear()
    SCHEMES.update(saved)


def test_fixed_scheme_trains_tensor_k_to_the_output(tmp_path, own_schemes):
    import elastictrainer

    SCHEMES = own_schemes
    name = _script().register_fixed(2)
    assert name in SCHEMES and not SCHEMES[name].elastic
    model = tiny_model(num_classes=3)
    before = snapshot(model.trainable_weights)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (16, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 3, 16).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    cfg = elastictrainer.Config(train_type=name, logdir=str(tmp_path), num_epochs=1,
                                optimizer="adam", learning_rate=1e-2, progress=False)
    summary = elastictrainer.run(cfg, model=model, data=(ds, ds), log=lambda *a: None)
    n = len(before)
    assert summary["epochs"][-1]["selected"] == n - 2
    changed = [not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_weights)]
    assert changed == [False, False] + [True] * (n - 2)


def test_table_gaps_and_mean():
    text = _script().table(
        [{"seed": 0, "full training": 82.0, "tensors 10- fixed": 81.0, "ElasticTrainer": 80.0},
         {"seed": 1, "full training": 80.0, "tensors 10- fixed": 77.0, "ElasticTrainer": 80.5}],
        [10], elastic=True)
    assert "81.0% (1.0 under)" in text and "80.5% (0.5 over)" in text
    assert ("| mean points under full training (negative: over) | | 2.0 (1.0 to 3.0) | "
            "0.8 (-0.5 to 2.0) |") in text


def test_last_epochs_table_and_swing():
    script = _script()
    last = {"full training": 81.0, "tensors 10- fixed": 78.0}
    text = script.table([{"seed": 3, "full training": 82.0, "tensors 10- fixed": 81.0,
                          script.LAST: last}], [10], elastic=False, measure=script.LAST)
    assert "| 3 | 81.0% | 78.0% (3.0 under) |" in text  # the last epochs' values, not the best
    epochs = [{"test_accuracy": a} for a in (10.0, 20.0, 30.0, 40.0, 70.0, 72.0, 66.0, 70.0)]
    # from epoch 5: 70 -> 72 -> 66 -> 70, moves of 2, 6 and 4
    assert script.swing({"epochs": epochs}) == 4.0
    assert script.swing({"epochs": epochs[:5]}) is None
