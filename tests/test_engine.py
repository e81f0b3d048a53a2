import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

from conftest import tiny_mlp
from elastictrainer import engine


OPTIMIZERS = {
    "sgdw_cosine": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.CosineDecay(0.1, 10), momentum=0.9, weight_decay=5e-2),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "sgd_clipnorm": lambda: keras.optimizers.SGD(0.1, clipnorm=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_apply_updates_matches_apply_gradients(name):
    """The leak-free update path is the keras one, number for number, on a subset too."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 6)), tf.float32)
    y = tf.constant(rng.integers(0, 3, 8), tf.int32)
    loss_fn = engine.make_loss()
    finals = []
    for mode in ("keras", "ours"):
        model = tiny_mlp(1)
        opt = engine.prepare_optimizer(OPTIMIZERS[name](), model.trainable_weights)
        subset = model.trainable_weights[1:]  # d1's kernel stays frozen

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            grads = tape.gradient(loss, subset)
            if mode == "keras":
                opt.apply_gradients(zip(grads, subset))
            else:
                engine.apply_updates(opt, grads, subset)

        for _ in range(4):
            step(x, y)
        finals.append([v.numpy() for v in model.trainable_weights] + [opt.iterations.numpy()])
    for a, b in zip(*finals):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert finals[1][-1] == 4
