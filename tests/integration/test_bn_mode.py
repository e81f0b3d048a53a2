"""--bn_mode inference (flavors/batchnorm.py): every BatchNorm layer of a tf-keras or Keras 3
model, nested ones included, runs on its moving statistics in training steps and leaves them
unchanged, its gamma and beta still train, the model's trainable weights stay as they were, and
the prefix cache may then cut above it; a run puts the model back as it came.  --bn_mode
frozen: the same for the BatchNorm layers below the deepest tensor a step trains only, in both
trainers (the command line's and model.fit's)."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from helpers import image_data
from elastictrainer import config
from elastictrainer.errors import UserError
from elastictrainer.flavors import batchnorm
from elastictrainer.prefix import plan as prefix_plan
from elastictrainer.prefix.graph import FlatGraph
from elastictrainer.runs import loop

SIZE, CLASSES, EXAMPLES, BATCH = 16, 4, 40, 8


def _keras(flavor):
    if flavor == "keras3":
        import keras
    else:
        import tf_keras as keras
    return keras


def bn_cnn(flavor="tf_keras", seed=0):
    """Input -> Rescaling -> conv-BN-ReLU (a nested functional backbone, called in the step's
    mode) -> conv-BN-ReLU -> pool -> dense: every BatchNorm computes batch statistics in a
    training step unless --bn_mode inference."""
    keras = _keras(flavor)
    keras.utils.set_random_seed(seed)
    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Rescaling(1 / 255.0, name="scale")(image)
    inner = keras.Input((SIZE, SIZE, 3))
    h = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="conv0")(inner)
    h = keras.layers.ReLU(name="relu0")(keras.layers.BatchNormalization(name="bn0")(h))
    x = keras.Model(inner, h, name="backbone")(x)
    x = keras.layers.Conv2D(12, 3, strides=2, padding="same", name="conv1")(x)
    x = keras.layers.ReLU(name="relu1")(keras.layers.BatchNormalization(name="bn1")(x))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x), name="bncnn")


def _images(n=BATCH, seed=0):
    return tf.constant(np.random.default_rng(seed).uniform(0, 255, (n, SIZE, SIZE, 3)),
                       tf.float32)


def _train_step(model, x, flavor):
    """One SGD step on every trainable weight, in training mode, traced."""
    keras = _keras(flavor)
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_weights)
    y = tf.zeros([x.shape[0]], tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))

    step()


def _stats(layers):
    return [(layer.moving_mean.numpy().copy(), layer.moving_variance.numpy().copy())
            for layer in layers]


def _alone_is_in_batch(model, x):
    """Whether each example's training-mode output is what it is alone."""
    together = model(x, training=True).numpy()
    alone = np.concatenate([model(x[i:i + 1], training=True).numpy()
                            for i in range(x.shape[0])])
    return np.allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_inference_mode_holds_the_moving_statistics_and_trains_gamma_and_beta(flavor):
    model = bn_cnn(flavor)
    layers = batchnorm.batch_norm_layers(model)
    assert sorted(layer.name for layer in layers) == ["bn0", "bn1"]  # the nested one too
    weights = [id(w) for w in model.trainable_weights]
    forced = batchnorm.apply(model, "inference")
    assert forced == layers and all(batchnorm.in_inference(layer) for layer in layers)
    assert [id(w) for w in model.trainable_weights] == weights
    assert all(layer.trainable for layer in layers)
    x = _images()
    stats, gammas = _stats(layers), [layer.gamma.numpy().copy() for layer in layers]
    _train_step(model, x, flavor)
    for (mean, var), layer in zip(stats, layers):
        np.testing.assert_array_equal(layer.moving_mean.numpy(), mean)
        np.testing.assert_array_equal(layer.moving_variance.numpy(), var)
    assert all(not np.array_equal(g, layer.gamma.numpy()) for g, layer in zip(gammas, layers))
    assert _alone_is_in_batch(model, x)
    assert batchnorm.apply(model, "inference") == []  # forced once

    batchnorm.restore(forced)
    assert not any(batchnorm.in_inference(layer) for layer in layers)
    assert not _alone_is_in_batch(model, x)  # batch statistics again
    stats = _stats(layers)
    _train_step(model, x, flavor)
    assert all(not np.array_equal(mean, layer.moving_mean.numpy())
               for (mean, _), layer in zip(stats, layers))


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_model_mode_changes_nothing(flavor):
    model = bn_cnn(flavor)
    assert batchnorm.apply(model, "model") == []
    assert not _alone_is_in_batch(model, _images())
    with pytest.raises(UserError, match="unknown --bn_mode 'batch'"):
        batchnorm.apply(model, "batch")


def test_the_prefix_graph_cuts_above_batchnorm_in_inference_mode():
    model = bn_cnn()
    names = [c.name for c in FlatGraph(model).cuts]
    assert names == ["scale", "conv0", "bn0", "relu0", "conv1", "bn1", "relu1", "pool"]
    sound = [c.name for c in FlatGraph(model).cuts if not c.batch_prefix]
    assert sound == ["scale", "conv0"]  # bn0 computes batch statistics: nothing above it
    forced = batchnorm.apply(model, "inference")
    try:
        assert all(not c.batch_prefix for c in FlatGraph(model).cuts)
    finally:
        batchnorm.restore(forced)
    assert [c.name for c in FlatGraph(model).cuts if not c.batch_prefix] == sound


def data(seed=0):
    return image_data(EXAMPLES, SIZE, CLASSES, BATCH, seed)


def cfg(tmp_path, name, **kw):
    base = dict(train_type="traditional_tl_training", optimizer="adam", learning_rate=0.01,
                num_epochs=2, logdir=str(tmp_path), run_name=name, progress=False,
                energy="none")
    return config.Config(**{**base, **kw})


def test_a_run_in_inference_mode_caches_above_batchnorm_and_gives_the_model_back(tmp_path):
    """The head trains (a fixed selection) from the pool's cached activations, which only
    --bn_mode inference allows; the moving statistics stay; the run's end undoes the mode."""
    summary = loop.run(cfg(tmp_path, "model", cache_frozen_prefix=True), log=lambda m: None,
                       model=bn_cnn(), data=data())
    build, = summary["prefix_cache"]["builds"]
    assert build["cut"] == "conv0"  # below bn0, which computes batch statistics

    model = _held_run_caches_at_the_pool(
        tmp_path, "inference", "--bn_mode inference: 2 BatchNorm layers of bncnn")
    assert not _alone_is_in_batch(model, _images())


def _held_run_caches_at_the_pool(tmp_path, bn_mode, said):
    """Traditional TL, cached, under `bn_mode`, which holds both BatchNorm layers: the cache
    cuts at the pool and serves, the run says `said`, the moving statistics stay, and the end
    of the run gives the layers back.  Returns the model."""
    model = bn_cnn()
    layers = batchnorm.batch_norm_layers(model)
    stats = _stats(layers)
    lines = []
    summary = loop.run(cfg(tmp_path, bn_mode, cache_frozen_prefix=True, bn_mode=bn_mode),
                       log=lines.append, model=model, data=data())
    assert summary["status"] == "finished"
    build, = summary["prefix_cache"]["builds"]
    assert build["cut"] == "pool" and summary["prefix_cache"]["served_steps"] > 0
    assert any(said in m for m in lines)
    for (mean, var), layer in zip(stats, layers):
        np.testing.assert_array_equal(layer.moving_mean.numpy(), mean)
        np.testing.assert_array_equal(layer.moving_variance.numpy(), var)
    assert not any(batchnorm.in_inference(layer) for layer in layers)
    return model


def test_full_training_in_inference_mode_trains_beta_and_holds_the_moving_statistics(
        tmp_path):
    model = bn_cnn()
    layers = batchnorm.batch_norm_layers(model)
    stats, betas = _stats(layers), [layer.beta.numpy().copy() for layer in layers]
    summary = loop.run(cfg(tmp_path, "full", train_type="full_training", bn_mode="inference"),
                       log=lambda m: None, model=model, data=data())
    assert summary["status"] == "finished"
    assert all(not np.array_equal(b, layer.beta.numpy()) for b, layer in zip(betas, layers))
    for (mean, _), layer in zip(stats, layers):
        np.testing.assert_array_equal(layer.moving_mean.numpy(), mean)


def test_the_no_usable_cut_line_names_the_flag(tmp_path):
    import tf_keras as keras

    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.BatchNormalization(name="bn_in")(image)  # below every cut point
    x = keras.layers.Conv2D(8, 3, padding="same", name="conv")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(keras.layers.ReLU(name="relu")(x))
    model = keras.Model(image, keras.layers.Dense(CLASSES, name="head")(x))
    lines = []
    cache = prefix_plan.plan(model, [], cfg(tmp_path, "p", cache_frozen_prefix=True),
                             EXAMPLES, str(tmp_path / "p"), log=lines.append)
    assert cache is None
    assert len(lines) == 1 and "have BatchNorm computing batch statistics below them (bn_in; " \
        "--bn_mode inference or frozen runs them on their moving statistics" in lines[0], lines


def test_a_run_resumes_only_in_the_mode_it_started_in(tmp_path):
    from elastictrainer.runs.checkpoint import check_same_run

    saved = dataclasses.asdict(cfg(tmp_path, "r"))
    check_same_run(saved, cfg(tmp_path, "r"), "run")
    with pytest.raises(UserError, match="--bn_mode model, not inference"):
        check_same_run(saved, cfg(tmp_path, "r", bn_mode="inference"), "run")
    del saved["bn_mode"]  # a run saved before the flag ran BatchNorm as the model called it
    check_same_run(saved, cfg(tmp_path, "r"), "run")
    with pytest.raises(UserError, match="--bn_mode model, not inference"):
        check_same_run(saved, cfg(tmp_path, "r", bn_mode="inference"), "run")


def _fit_steps(model, hold):
    from elastictrainer.fit.steps import FitSteps
    from elastictrainer.flavors import optimizers
    from elastictrainer.method.schemes import SCHEMES

    import tf_keras as keras
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizers.prepare_optimizer(model.optimizer, model.trainable_weights)
    return FitSteps(model, model.optimizer, SCHEMES["elastic_training"].importance,
                    bn_hold=hold)


def _compiled_steps(model, hold):
    import tf_keras as keras
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.method.schemes import SCHEMES
    from elastictrainer.train.compiled import CompiledSteps

    return CompiledSteps(model, keras.optimizers.SGD(0.05), SCHEMES["elastic_training"],
                         tensor_roles(model), bn_hold=hold)


@pytest.mark.parametrize("trainer", [_compiled_steps, _fit_steps])
def test_frozen_mode_holds_the_batchnorm_below_each_selection_and_none_for_every_gradient(
        trainer):
    """Tensors: conv0 (0, 1), bn0 (2, 3), conv1 (4, 5), bn1 (6, 7), head (8, 9).  The head's
    step holds both layers, conv1's holds bn0 only (their moving statistics stay, the others'
    move), the probe (every gradient) holds none; every layer is given back at the end."""
    model = bn_cnn()
    bn0, bn1 = (model.get_layer("backbone").get_layer("bn0"), model.get_layer("bn1"))
    hold = batchnorm.FrozenHold(model, list(model.trainable_weights))
    assert set(hold.layers_for((8, 9))) == {bn0, bn1} and hold.layers_for((4, 9)) == (bn0,)
    assert hold.layers_for(tuple(range(10))) == () and hold.layers_for((3, 8)) == ()
    steps = trainer(model, hold)
    x, y = _images(), tf.zeros([BATCH], tf.int32)
    for selection, still in (((8, 9), (bn0, bn1)), ((4, 5, 8, 9), (bn0,))):
        stats = _stats([bn0, bn1])
        steps.step_for(selection)(x, y)
        assert set(hold.held) == set(still)
        for (mean, _), layer in zip(stats, (bn0, bn1)):
            assert np.array_equal(mean, layer.moving_mean.numpy()) == (layer in still)
    steps.probe_step(x, y, want_terms=False)
    assert hold.held == () and not any(batchnorm.in_inference(l) for l in (bn0, bn1))
    steps.step_for((8, 9))
    hold.release()
    assert not any(batchnorm.in_inference(l) for l in (bn0, bn1))


def test_a_frozen_mode_run_caches_above_the_held_batchnorm_and_gives_the_model_back(tmp_path):
    """Traditional TL (the head alone) in --bn_mode frozen: every BatchNorm lies below the
    head, so the cache cuts at the pool as under --bn_mode inference, the moving statistics
    stay, and the run's end gives the layers back."""
    _held_run_caches_at_the_pool(tmp_path, "frozen",
                                 "--bn_mode frozen: of the 2 BatchNorm layers of bncnn")
