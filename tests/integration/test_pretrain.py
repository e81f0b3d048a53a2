"""Own models with another class count (a new classifier, backbone-only --weights PATH) and
`--weights synthetic` (models/pretrain.py: pretraining on a disjoint synthetic source task,
cached once)."""
import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import main as main_cli
from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.data import synthetic
from elastictrainer.models import MODELS, pretrain
from elastictrainer.models.build import build_model

from helpers import tiny_model, write_image_folder  # noqa: E402

# A few steps instead of the real recipe: these tests check the mechanics, not the accuracy.
TINY_RECIPE = dict(steps=4, batch_size=8, calibration_batches=2, seconds_at_32=1)


@pytest.fixture
def tiny_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setitem(MODELS, "smallcnn",
                        dataclasses.replace(MODELS["smallcnn"], synthetic=TINY_RECIPE))
    calls = []
    real = pretrain.pretrain

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrain, "pretrain", counted)
    return calls


# ------------------------------------------------------------------------- the source task

def test_source_task_is_the_same_generator_with_its_own_classes():
    orient, freq, tint = synthetic.synthetic_source_class_params()
    assert len(orient) == synthetic.SOURCE_NUM_CLASSES == 36
    assert len({(round(float(o), 4), float(f)) for o, f in zip(orient, freq)}) == 36  # distinct
    examples = list(synthetic.synthetic_source_examples(24, 72, seed=1).as_numpy_iterator())
    labels = [int(y) for _, y in examples]
    assert sorted(set(labels)) == list(range(36)) and labels.count(0) == 2  # balanced
    x = np.stack([x for x, _ in examples])
    assert x.shape == (72, 24, 24, 3) and 0 <= x.min() and x.max() <= 255
    again = np.stack([x for x, _ in synthetic.synthetic_source_examples(24, 72, seed=1)])
    np.testing.assert_array_equal(x, again)
    target = np.stack([x for x, _ in synthetic.synthetic_examples(24, 72, seed=1)])
    assert not np.allclose(x, target)


# ------------------------------------------------------------------------- --weights synthetic

def test_cache_is_made_once_reused_and_rebuilt_when_corrupt(tiny_recipe, tmp_path):
    logs = []
    keras.utils.set_random_seed(0)
    first = build_model("smallcnn", input_size=16, num_classes=3, weights="synthetic",
                        log=logs.append, progress=False)
    path = pretrain.cache_path("smallcnn", 16)
    assert path.startswith(str(tmp_path / "keras_home" / "models")) and os.path.isfile(path)
    assert f"_v{pretrain.VERSION}" in os.path.basename(path) and "i16" in os.path.basename(path)
    assert len(tiny_recipe) == 1
    assert any("pretraining smallcnn" in m for m in logs) and all("\n" not in m for m in logs)
    backbone = pretrain.backbone_of(first)
    # BatchNorm statistics were set from source data (fresh layers hold 0 and 1)
    means = [w.numpy() for w in backbone.weights if "moving_mean" in w.name]
    variances = [w.numpy() for w in backbone.weights if "moving_variance" in w.name]
    assert len(means) == 6 and all(np.abs(m).max() > 1e-3 for m in means)
    assert all(np.abs(v - 1).max() > 1e-3 for v in variances)
    assert not any(os.path.basename(f).startswith(os.path.basename(path)[:-11] + ".tmp")
                   for f in os.listdir(os.path.dirname(path)))  # no temp file left

    mtime = os.path.getmtime(path)
    logs.clear()
    keras.utils.set_random_seed(0)
    second = build_model("smallcnn", input_size=16, num_classes=3, weights="synthetic",
                         log=logs.append, progress=False)
    assert len(tiny_recipe) == 1 and os.path.getmtime(path) == mtime and logs == []
    for a, b in zip(first.weights, second.weights):  # same backbone, same seeded new head
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    with open(path, "wb") as f:
        f.write(b"not an HDF5 file")
    keras.utils.set_random_seed(0)
    third = build_model("smallcnn", input_size=16, num_classes=3, weights="synthetic",
                        log=logs.append, progress=False)
    assert len(tiny_recipe) == 2
    assert any("does not load" in m and "making it again" in m for m in logs)
    for a, b in zip(first.weights, third.weights):  # pretraining is deterministic
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_strategys_run_pretrains_before_entering_its_scope(tiny_recipe, tmp_path,
                                                            monkeypatch):
    """--weights synthetic under --strategy mirrored, the backbone not cached yet: pretraining
    (a one-device loop, whose loss reduction a strategy's scope refuses) runs before the run
    enters the strategy's scope, then the run trains on the weights it made."""
    from elastictrainer import config
    from elastictrainer.runs import loop
    from elastictrainer.train import distribution

    # a MirroredStrategy over this process's one CPU stands for --logical_cpus 2, which only a
    # fresh process can split the CPU for: its scope refuses the reduction all the same
    monkeypatch.setattr(distribution, "configure", lambda cfg: distribution.Distribution(
        tf.distribute.MirroredStrategy(["/cpu:0"])))
    cfg = config.Config(model_name="smallcnn", weights="synthetic", dataset_name="synthetic",
                        input_size=16, num_train=16, num_test=8, batch_size=4,
                        strategy="mirrored", num_epochs=1, steps_per_epoch=2,
                        train_type="full_training", logdir=str(tmp_path / "logs"),
                        run_name="r", progress=False)
    summary = loop.run(cfg, log=lambda m: None)
    assert summary["status"] == "finished" and summary["strategy"] == "mirrored"
    assert len(tiny_recipe) == 1 and os.path.isfile(pretrain.cache_path("smallcnn", 16))


def test_resample_smooths_pixel_noise_and_keeps_the_image():
    """Recipe.resample: a sub-pixel shift and a few degrees of rotation, bilinear, as the
    target's rotation augmentation resamples its training images: pixel noise is smoothed,
    the picture stays where it was."""
    noise = tf.random.stateless_normal([4, 32, 32, 3], [1, 2]) * 30.0 + 128.0
    layer_in = keras.Input((32, 32, 3))
    model = keras.Model(layer_in, pretrain.resample(layer_in, 32))
    resampled = model(noise, training=True).numpy()
    assert resampled.shape == noise.shape
    assert np.std(resampled) < 0.9 * np.std(noise.numpy())  # interpolation averages the noise
    assert np.allclose(model(noise, training=False).numpy(), noise.numpy())  # training only
    # a smooth picture survives: one pixel of shift and 5 degrees move it little
    ramp = tf.tile(tf.linspace(0.0, 255.0, 32)[None, None, :, None], [1, 32, 1, 3])
    moved = model(ramp, training=True).numpy()
    assert np.abs(moved - ramp.numpy())[:, 8:-8, 8:-8].mean() < 0.05 * 255


@pytest.mark.parametrize("resample", [False, True])
def test_recipe_resample_is_applied_in_pretraining(tiny_recipe, monkeypatch, resample):
    monkeypatch.setitem(MODELS, "smallcnn", dataclasses.replace(
        MODELS["smallcnn"], synthetic=dict(TINY_RECIPE, resample=resample)))
    calls = []
    real = pretrain.resample

    def spy(image, input_size):
        calls.append(input_size)
        return real(image, input_size)

    monkeypatch.setattr(pretrain, "resample", spy)
    build_model("smallcnn", input_size=16, num_classes=3, weights="synthetic",
                log=lambda *a: None, progress=False)
    assert calls == ([16] if resample else [])
    assert len(tiny_recipe) == 1 and os.path.isfile(pretrain.cache_path("smallcnn", 16))


def test_pretraining_makes_features_that_transfer(monkeypatch, tmp_path):
    """A short real pretraining: the source task is learnt with BatchNorm in inference mode
    (so its statistics were set), and its features separate the *target* classes better than
    random ones (nearest class mean on pooled backbone features of the synthetic dataset)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setitem(MODELS, "smallcnn", dataclasses.replace(
        MODELS["smallcnn"], synthetic=dict(MODELS["smallcnn"].synthetic, steps=150)))
    accuracy = pretrain.pretrain("smallcnn", 16, str(tmp_path / "b.weights.h5"), log=lambda m: None,
                                 progress=False)
    assert accuracy > 20  # 36 classes: chance is 2.8% (16 px, 150 steps: 29% here)

    def probe(weights):
        keras.utils.set_random_seed(0)
        model = build_model("smallcnn", input_size=16, num_classes=10)
        if weights:
            pretrain.backbone_of(model).load_weights(weights)
        features = keras.Model(model.inputs, model.get_layer("global_pool").output)
        bundle = synthetic.synthetic_dataset(input_size=16, batch_size=64, num_train=320,
                                           num_test=160, seed=3)

        def embed(ds):
            xs, ys = zip(*[(features(x, training=False).numpy(), y.numpy()) for x, y in ds])
            return np.concatenate(xs), np.concatenate(ys)

        xtr, ytr = embed(bundle.train)
        xte, yte = embed(bundle.test)
        mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
        xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
        means = np.stack([xtr[ytr == c].mean(0) for c in range(10)])
        guess = np.argmin(((xte[:, None] - means[None]) ** 2).sum(-1), axis=1)
        return 100 * np.mean(guess == yte)

    pretrained, random = probe(str(tmp_path / "b.weights.h5")), probe(None)
    assert pretrained > random + 10, (pretrained, random)


def test_synthetic_refuses_user_models_and_large_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    path = str(tmp_path / "mine.keras")
    tiny_model(num_classes=4).save(path)
    with pytest.raises(UserError, match="built-in model"):
        build_model(path, weights="synthetic")
    with pytest.raises(UserError, match="input sizes up to"):
        build_model("smallcnn", input_size=160, num_classes=3, weights="synthetic")
    assert not os.path.isdir(tmp_path / "models") or not os.listdir(tmp_path / "models")


# ------------------------------------------------------------------------- own models, new heads

def test_saved_model_on_a_dataset_with_other_class_counts(tmp_path):
    """A 10-class saved model on 3- and 12-class folders trains a new head: the run's class
    count, tensor count and timing table are the new model's."""
    model_path = str(tmp_path / "ten.keras")
    tiny_model(num_classes=10, size=16).save(model_path)
    for classes, train_type in ((3, "elastic_training"), (12, "full_training")):
        folder = write_image_folder(tmp_path / f"data{classes}",
                                    classes=tuple(f"c{i:02d}" for i in range(classes)), per_class=3)
        table = tmp_path / f"table{classes}.json"
        argv = ["--model_name", model_path, "--dataset_name", str(folder), "--input_size", "16",
                "--weights", "none", "--num_epochs", "1", "--steps_per_epoch", "2",
                "--train_type", train_type, "--rho", "0.9", "--timing_table", str(table),
                "--logdir", str(tmp_path / "logs"), "--run_name", f"c{classes}", "--quiet"]
        assert main_cli.main(argv) == 0
        run = tmp_path / "logs" / f"c{classes}"
        assert json.load(open(run / runlog.CONFIG_FILE))["num_classes"] == classes
        summary = json.load(open(run / runlog.SUMMARY_FILE))
        assert summary["status"] == "finished" and summary["num_tensors"] == 8
        assert summary["tensor_names"][-2:] == ["head/kernel:0", "head/bias:0"]
        if train_type == "elastic_training":
            profiled = json.load(open(table))
            assert profiled["num_classes"] == classes
            assert len(summary["selections"][0]["mask"]) == 8
