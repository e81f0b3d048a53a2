"""scripts/bench_fixed_selection.py: its fixed scheme trains exactly tensor k to the output."""
import numpy as np
import tensorflow as tf

from helpers import bench_fixed_selection_script as _script, snapshot, tiny_model


def test_fixed_scheme_trains_tensor_k_to_the_output(tmp_path):
    import elastictrainer
    from elastictrainer.method.schemes import SCHEMES

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
