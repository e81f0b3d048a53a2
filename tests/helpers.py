"""What the tests share besides fixtures: the repository's root, tiny models, batches and image
folders, all generated offline in seconds.  Tests at every level import them from here
(`from helpers import tiny_model`); fixtures are conftest.py's."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import os

import numpy as np
import tensorflow as tf
import tf_keras as keras
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "elastictrainer")


def package_files():
    """Paths of every .py file of the package, for the tests that read its source."""
    return sorted(os.path.join(folder, f) for folder, _, files in os.walk(PACKAGE)
                  for f in files if f.endswith(".py"))


def tiny_model(num_classes=10, size=16):
    """Deterministic (no dropout, no augmentation) conv/BN/dense model."""
    inp = keras.Input((size, size, 3))
    x = keras.layers.Rescaling(1 / 255.0, name="scale")(inp)
    x = keras.layers.Conv2D(8, 3, padding="same", name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="c2")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(inp, x)


def batch(n=4, size=16, num_classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.uniform(0, 255, (n, size, size, 3)), tf.float32),
            tf.constant(rng.integers(0, num_classes, n), tf.int32))


def load_script(name):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snapshot(variables):
    return [v.numpy().copy() for v in variables]


def paper_taylor_by_hand(model, grads, step):
    """The paper's eq. 6 by hand, the naive reference: I_k = -sum g(w + dw) * dw, with
    g0 = grads() at w, dw = step(g0), and g1 = grads() at w + dw; every weight (and a
    normalisation layer's moving statistics) is put back afterwards."""
    w0, bn0 = snapshot(model.trainable_weights), snapshot(model.non_trainable_weights)
    dw = step(grads())
    for v, w, d in zip(model.trainable_weights, w0, dw):
        v.assign(w + d)
    g1 = grads()
    naive = np.array([-np.sum(a.astype(np.float64) * d) for a, d in zip(g1, dw)])
    for v, w in zip(model.trainable_weights + model.non_trainable_weights, w0 + bn0):
        v.assign(w)
    return naive


def tiny_cnn(num_classes=5):
    inp = keras.Input((24, 24, 3))
    x = keras.layers.Rescaling(1 / 255.0)(inp)
    x = keras.layers.Conv2D(8, 3, name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="r1")(x)
    x = keras.layers.DepthwiseConv2D(3, name="dw")(x)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Conv2D(16, 3, name="c2", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(num_classes, name="fc")(x)
    return keras.Model(inp, x)


def tiny_attention(num_classes=5):
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(16, 4, strides=4, name="patch")(inp)
    x = keras.layers.Reshape((16, 16), name="tokens")(x)
    h = keras.layers.LayerNormalization(name="ln1")(x)
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(h, h)
    x = keras.layers.Add(name="res1")([x, h])
    h = keras.layers.LayerNormalization(name="ln2")(x)
    h = keras.layers.Dense(32, activation="gelu", name="mlp1")(h)
    h = keras.layers.Dense(16, name="mlp2")(h)
    x = keras.layers.Add(name="res2")([x, h])
    x = keras.layers.GlobalAveragePooling1D(name="gap")(x)
    x = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(inp, x)


def tiny_mlp(seed):
    """Two dense layers on 6 features, seeded."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((6,))
    x = keras.layers.Dense(5, activation="relu", name="d1")(inp)
    x = keras.layers.Dense(3, name="d2")(x)
    return keras.Model(inp, x)


def write_image_folder(root, classes=("cat", "dog", "eel"), per_class=5, fmt="png"):
    """Uniformly coloured images of different sizes; red = class*80 + 7*i identifies each file."""
    for c, name in enumerate(classes):
        os.makedirs(root / name, exist_ok=True)
        for i in range(per_class):
            size = (10 + 3 * i, 14 + 2 * c)
            colour = (c * 80 + 7 * i, 20 * i % 256, 200 - 30 * c)
            Image.new("RGB", size, colour).save(root / name / f"img{i}.{fmt}")
    return root


# ------------------------------------------------------------------ datasets
TFDS_CLASSES = {"caltech_birds2011": 200, "oxford_iiit_pet": 37, "stanford_dogs": 120}


# ------------------------------------------------------------------ the scripts
def script_cli(script, argv, capture):
    """Run `script`.py's main (main, profiler or plot) in this process as `python script.py
    argv` runs it, through errors.run_cli: (exit code, stdout, non-blank stderr lines).  An
    exception run_cli lets through (a traceback, run as a script) fails the caller's test.
    capture: pytest's capsys, or capfd to see what TensorFlow's C++ side writes to stderr too."""
    import importlib

    import pytest

    from elastictrainer import errors

    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as e:
        errors.run_cli(module.main, argv)
    out, err = capture.readouterr()
    return e.value.code, out, [line for line in err.splitlines() if line.strip()]


def run_profiler_cli(args, cwd):
    """profiler.py with `args` in a subprocess: its CompletedProcess, output captured."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, os.path.join(ROOT, "profiler.py")] + args, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------ plot.py
def assert_figures(base):
    for ext, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        path = base + ext
        assert os.path.getsize(path) > 1000, path
        with open(path, "rb") as f:
            assert f.read(4) == magic


def plot_cli(argv, capsys):
    """Run plot.py as `python plot.py` does: (exit code, stdout, stderr lines)."""
    return script_cli("plot", argv, capsys)


# ------------------------------------------------------------------ figures
# what a figure driver's command line for one training run holds
TRAIN_COMMAND = " -m elastictrainer train "


# ------------------------------------------------------------------ scripts/bench_*.py
def bench_fixed_selection_script():
    return load_script("bench_fixed_selection")


def bench_runtime_summary(train_time_s, acc, steps_per_epoch=10, epochs=2, **elastic):
    """A run's summary.json as far as scripts/bench_runtime.py reads it."""
    s = {"steps_per_epoch": steps_per_epoch, "epochs": [{}] * epochs,
         "train_time_s": train_time_s, "best_test_accuracy": acc}
    if elastic:
        s.update({"num_tensors": 20, "plan": {"forward_floor": 0.2, "affordable_tensors": 9},
                  "corrections": [], **elastic})
    return s


def keras3_cnn(num_classes=5, size=16, augment=False, name="k3cnn"):
    """A small Keras 3 (`import keras`) CNN with unfused BatchNormalization; augment: a random
    flip in front and dropout before the head (random state a run must carry on)."""
    import keras as keras3

    inp = keras3.Input((size, size, 3))
    x = keras3.layers.RandomFlip("horizontal")(inp) if augment else inp
    x = keras3.layers.Rescaling(1 / 255.0)(x)
    for filters in (8, 16):
        x = keras3.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = keras3.layers.BatchNormalization()(x)
        x = keras3.layers.ReLU()(x)
    x = keras3.layers.GlobalAveragePooling2D()(x)
    if augment:
        x = keras3.layers.Dropout(0.3)(x)
    outputs = keras3.layers.Dense(num_classes)(x)
    return keras3.Model(inp, outputs, name=name)


def assert_fresh_step_matches_general_probe(tr, data, covered, monkeypatch):
    """optimizers.fresh_step (no snapshot, update or restore) against importance.probe_terms, which
    takes the step with the optimizer itself from zeroed slots and restores everything: the
    same importance on `data`, the weights and slots untouched; `covered`: whether the closed
    form covers the optimizer (else the general path is the one taken)."""
    import numpy as np

    from elastictrainer.flavors import optimizers
    from elastictrainer.method import importance
    bn0 = snapshot(tr.model.non_trainable_weights)
    general = importance.probe_terms(tr, data, fresh_state=True, after=False)[0]
    for v, w in zip(tr.model.non_trainable_weights, bn0):
        v.assign(w)
    assert optimizers.fresh_step_supported(tr.optimizer, tr.variables) == covered
    if covered:  # the closed form must not fall back to the general path
        monkeypatch.setattr(importance, "probe_terms", None)
    w0, o0 = snapshot(tr.variables), snapshot(tr.optimizer.variables)
    fast = importance.taylor_importance(tr, data)
    # the general path's dw is a difference of float32 weights: rounding, not the formula
    np.testing.assert_allclose(fast, general, rtol=2e-3, atol=1e-9)
    assert np.all(np.abs(fast) > 0)
    assert all(np.array_equal(a, b) for a, b in zip(w0, snapshot(tr.variables)))
    assert all(np.array_equal(a, b) for a, b in zip(o0, snapshot(tr.optimizer.variables)))


def updates_by_keras_and_ours(make_model, make_optimizer, x, y, steps=4):
    """Final weights and iteration count after `steps` steps on (x, y) of the model's tensors
    but its first, updated by Keras' own apply_gradients and by optimizers.apply_updates (the path
    without merge_call): two lists to compare."""
    from elastictrainer.train import steps as train_steps
    from elastictrainer.flavors import optimizers
    loss_fn = train_steps.make_loss()
    finals = []
    for mode in ("keras", "ours"):
        model, opt = make_model(), make_optimizer()
        optimizers.prepare_optimizer(opt, model.trainable_weights)
        subset = model.trainable_weights[1:]  # the first kernel stays frozen

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, subset)
            if mode == "keras":
                opt.apply_gradients(zip(grads, subset))
            else:
                optimizers.apply_updates(opt, grads, subset)

        for _ in range(steps):
            step(x, y)
        finals.append([v.numpy() for v in model.trainable_weights] + [opt.iterations.numpy()])
    return finals


def scripted_table(model, path, input_size, batch_size, optimizer, t_fp_ms=30.0, t_full_ms=100.0):
    """Write a timing table for `model` with scripted times instead of profiled ones: the
    forward pass t_fp_ms of a t_full_ms step, the backward shared evenly among the tensors
    (t_dw = t_dy for each).  Under rho r a selection then has a backward budget of
    r * t_full_ms - t_fp_ms, whatever the machine's timings: with the defaults and rho 0.6 or
    0.7, some tensors and never all.  Returns `path`."""
    from elastictrainer import flavors
    from elastictrainer.profiler import table as ptable, table_format

    variables = model.trainable_weights
    n = len(variables)
    each = (t_full_ms - t_fp_ms) / (2 * n)
    table = {
        "version": table_format.TABLE_VERSION, "model": model.name, "input_size": input_size,
        "batch_size": batch_size, "num_classes": int(model.output_shape[-1]),
        "optimizer": optimizer, "t_fp_ms": t_fp_ms, "t_full_ms": t_full_ms,
        "t_bp_ms": t_full_ms - t_fp_ms, "t_grads_ms": None, "t_fp_ops_ms": None,
        "t_bp_ops_ms": None, "t_fp_layers_ms": None, "coverage": 1.0, "unattributed": [],
        "num_iterations": None,
        "timing_note": None, "compile_ms": None, "calibration": None, "calibration_skipped": None,
        "tensors": [{"name": flavors.tensor_name(v), "shape": [int(d) for d in v.shape],
                     "t_dw_ms": each, "t_dy_ms": each, "estimated": False, "rank": n - 1 - k}
                    for k, v in enumerate(variables)],
        "created": None, "host": None, "trace": None, "profiling_wall_s": None,
        "peak_rss_mb": None, "profiled_pid": None}
    ptable.save_table(table, str(path))
    return str(path)


def smallcnn_scripted_table(path, **times):
    """scripted_table for the runs of `--model_name smallcnn --weights none --input_size 16
    --batch_size 8 --optimizer adam` on the synthetic dataset's 10 classes; `path`."""
    from elastictrainer.models.build import build_sized

    model, _, _ = build_sized("smallcnn", 16, 10, "none", log=lambda m: None, progress=False)
    return scripted_table(model, path, 16, 8, "adam", **times)


def flat_cnn(keras_module, num_classes=5, size=16, seed=0, name="flat"):
    """Rescaling -> conv0 -> conv1 -> pool -> dense in `keras_module` (Keras 3 or tf-keras): no
    BatchNorm, no random layer, so its forward pass is a function of its weights alone, and
    its cut points (prefix/graph.py) lie above conv0.  Seeded."""
    keras_module.utils.set_random_seed(seed)
    layers = keras_module.layers
    inputs = keras_module.Input((size, size, 3))
    h = layers.Rescaling(1 / 255.0, name="scale")(inputs)
    for i, filters in enumerate((8, 16)):
        h = layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu",
                          name=f"conv{i}")(h)
    h = layers.GlobalAveragePooling2D(name="pool")(h)
    return keras_module.Model(inputs, layers.Dense(num_classes, name="head")(h), name=name)


def image_data(examples, size=16, classes=4, batch=8, seed=0, test=16):
    """(train, test) tf.data datasets of batches: `examples` fixed random images with balanced
    labels, the train set reshuffled every epoch under the seed (and TensorFlow's global seed
    set to it), the test set its first `test` images."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 255, (examples, size, size, 3)).astype(np.float32)
    y = (np.arange(examples) % classes).astype(np.int32)
    tf.random.set_seed(seed)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        examples, seed=seed, reshuffle_each_iteration=True).batch(batch)
    return train, tf.data.Dataset.from_tensor_slices((x[:test], y[:test])).batch(test)
