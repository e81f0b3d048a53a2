"""train_steps.py's update path computed for real: apply_updates is keras' apply_gradients, number for
number, and the learning-rate schedule is the optimizer's own unless chosen."""
import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

from helpers import tiny_mlp, updates_by_keras_and_ours
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers


OPTIMIZERS = {
    "sgdw_cosine": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.CosineDecay(0.1, 10), momentum=0.9, weight_decay=5e-2),
    "adam": lambda: keras.optimizers.Adam(0.05),
    # --lr_schedule cosine with adam: the per-tensor bias correction reads the scheduled lr
    "adam_cosine": lambda: keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.05, 10)),
    "sgd_clipnorm": lambda: keras.optimizers.SGD(0.1, clipnorm=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_apply_updates_matches_apply_gradients(name):
    """The leak-free update path is the keras one, number for number, on a subset too."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 6)), tf.float32)
    y = tf.constant(rng.integers(0, 3, 8), tf.int32)
    finals = updates_by_keras_and_ours(lambda: tiny_mlp(1), OPTIMIZERS[name], x, y)
    for a, b in zip(*finals):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert finals[1][-1] == 4


@pytest.mark.parametrize("name,schedule,expected", [
    ("sgd", None, "cosine"), ("adam", None, "constant"),  # the reference's, by default
    ("adam", "cosine", "cosine"), ("sgd", "constant", "constant")])
def test_the_lr_schedule_is_the_optimizers_own_unless_chosen(name, schedule, expected):
    model = tiny_mlp(1)
    opt = optimizers.prepare_optimizer(
        optimizers.make_optimizer(name, 0.1, 0.0, total_steps=10, schedule=schedule),
        model.trainable_weights)
    grads = [tf.ones_like(v) for v in model.trainable_weights]
    for _ in range(6):
        optimizers.apply_updates(opt, grads, model.trainable_weights)
    # the rate of the 6th step (iteration 5 of 10)
    want = 0.1 * 0.5 * (1 + np.cos(np.pi * 5 / 10)) if expected == "cosine" else 0.1
    assert float(opt.learning_rate) == pytest.approx(want, rel=1e-5)


def _compare(build, grads_fn_args, make_opt, steps=3, xla=False):
    """Final weights after `steps` updates through apply_gradients and through apply_updates."""
    finals = []
    for mode in ("keras", "ours"):
        model = build()
        opt = optimizers.prepare_optimizer(make_opt(), model.trainable_weights)
        opt.jit_compile = xla  # the XLA update step (Keras' default on a GPU) can run on a CPU too
        variables = model.trainable_weights
        x, y = grads_fn_args

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = train_steps.make_loss()(y, model(x))
            grads = tape.gradient(loss, variables)
            if mode == "keras":
                opt.apply_gradients(zip(grads, variables))
            else:
                optimizers.apply_updates(opt, grads, variables)

        for _ in range(steps):
            step(x, y)
        finals.append([v.numpy() for v in variables])
    for a, b in zip(*finals):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    return finals[1]


def test_apply_updates_applies_variable_constraints_as_keras_does():
    def build():
        keras.utils.set_random_seed(0)
        inp = keras.Input((6,))
        out = keras.layers.Dense(3, kernel_constraint=keras.constraints.NonNeg(), name="d")(inp)
        return keras.Model(inp, out)

    rng = np.random.default_rng(0)
    batch = (tf.constant(rng.normal(size=(8, 6)), tf.float32),
             tf.constant(rng.integers(0, 3, 8), tf.int32))
    kernel = _compare(build, batch, lambda: keras.optimizers.SGD(0.5))[0]
    assert kernel.min() >= 0 and (kernel == 0).any()  # the constraint clipped something


def test_apply_updates_deduplicates_sparse_gradients_as_keras_does():
    def build():
        keras.utils.set_random_seed(0)
        inp = keras.Input((4,), dtype="int32")
        x = keras.layers.Embedding(10, 5, name="emb")(inp)
        out = keras.layers.Dense(3, name="d")(keras.layers.Flatten()(x))
        return keras.Model(inp, out)

    ids = tf.constant([[1, 1, 2, 3], [1, 4, 4, 2]], tf.int32)  # repeated rows in one batch
    _compare(build, (ids, tf.constant([0, 2], tf.int32)), lambda: keras.optimizers.Adam(0.1))


def test_apply_updates_takes_the_xla_update_where_keras_would():
    rng = np.random.default_rng(1)
    batch = (tf.constant(rng.normal(size=(8, 6)), tf.float32),
             tf.constant(rng.integers(0, 3, 8), tf.int32))
    _compare(lambda: tiny_mlp(2), batch, lambda: keras.optimizers.Adam(0.05), xla=True)
