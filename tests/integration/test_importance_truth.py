"""experiments/importance_truth.py, the importance benchmark's measurement on real fine-tunes:
its masked SGD trains exactly one tensor as plain SGD with momentum would, its estimators are
what their formulas say (checked against a naive reference on a model small enough to take the
Hessian whole), and its summary picks and bins as documented."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from elastictrainer.experiments import importance_report as report
from elastictrainer.experiments import importance_truth as it


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(3, activation="tanh", input_shape=(4,)),
                              keras.layers.Dense(2)])
    return model


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(tf.constant(rng.normal(size=(8, 4)).astype(np.float32)),
             tf.constant(rng.integers(0, 2, 8))) for _ in range(n)]


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_masked_sgd_trains_one_tensor_as_sgd_with_momentum():
    model = _model()
    truth = it.Truth(model, LOSS, lr=0.1, momentum=0.9)
    batches = _batches(3)
    start = [v.numpy() for v in truth.variables]
    truth.train({2}, batches)  # the second layer's kernel alone
    # by hand: v = 0.9 v - lr g; w += v, the other tensors untouched
    ref = _model()
    ref.set_weights([w for w in model.get_weights()])  # same structure
    for v, w in zip(ref.trainable_weights, start):
        v.assign(w)
    velocity = np.zeros_like(start[2])
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = LOSS(y, ref(x, training=True))
        g = tape.gradient(loss, ref.trainable_weights[2]).numpy()
        velocity = 0.9 * velocity - 0.1 * g
        ref.trainable_weights[2].assign_add(velocity)
    np.testing.assert_allclose(truth.variables[2].numpy(), ref.trainable_weights[2].numpy(),
                               rtol=1e-5, atol=1e-6)
    for k in (0, 1, 3):
        np.testing.assert_array_equal(truth.variables[k].numpy(), start[k])


def test_the_held_out_loss_sees_one_network_under_dropout():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(8, input_shape=(4,)),
                              keras.layers.Dropout(0.5), keras.layers.Dense(2)])
    truth = it.Truth(model, LOSS, lr=0.1)
    held = _batches(2)
    plain = float(np.mean([float(LOSS(y, model(x, training=False))) for x, y in held]))
    assert truth.held_loss(held).mean() == pytest.approx(plain, rel=1e-6)
    np.testing.assert_array_equal(truth.held_loss(held), truth.held_loss(held))


def test_estimators_match_a_naive_reference():
    model = _model()
    lr, momentum = 0.05, 0.5
    truth = it.Truth(model, LOSS, lr=lr, momentum=momentum)
    probes = _batches(2, seed=1)
    est = truth.estimates(probes, seed=3)
    s = 1 / (1 - momentum)
    grads = []
    taylor, trial, held = np.zeros(4), np.zeros(4), np.zeros(4)
    for i, (x, y) in enumerate(probes):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        g = [t.numpy().astype(np.float64) for t in tape.gradient(loss, model.trainable_weights)]
        grads.append(g)
        xo, yo = probes[(i + 1) % 2]
        other = float(LOSS(yo, model(xo)))
        for k, v in enumerate(model.trainable_weights):
            taylor[k] += lr * np.sum(g[k] ** 2)
            w = v.numpy()
            v.assign(w - s * lr * g[k].astype(np.float32))
            trial[k] += float(loss) - float(LOSS(y, model(x)))
            held[k] += other - float(LOSS(yo, model(xo)))
            v.assign(w)
    np.testing.assert_allclose(est["taylor"], taylor, rtol=1e-4)
    np.testing.assert_allclose(est["trial"], trial, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(est["trial_held"], held, rtol=1e-3, atol=1e-6)
    cross = [lr * 2 * float(np.sum(grads[0][k] * grads[1][k])) for k in range(4)]
    np.testing.assert_allclose(est["cross"], cross, rtol=1e-4, atol=1e-9)
    # curvature: s lr |g|^2 - s^2/2 dw_k.H.(sum_j e_j dw_j) e_k, the signs drawn as estimates does
    rng = np.random.default_rng(3)
    curvature = np.zeros(4)
    for (x, y), g in zip(probes, grads):
        signs = rng.choice([-1.0, 1.0], 4)
        vec = [tf.constant(-lr * e * gk, tf.float32) for e, gk in zip(signs, g)]
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = LOSS(y, model(x, training=True))
            gg = inner.gradient(loss, model.trainable_weights)
            gv = tf.add_n([tf.reduce_sum(a * b) for a, b in zip(gg, vec)])
        hv = outer.gradient(gv, model.trainable_weights)
        for k in range(4):
            own = signs[k] * np.sum(-lr * g[k] * hv[k].numpy())
            curvature[k] += s * lr * np.sum(g[k] ** 2) - 0.5 * s * s * own
    np.testing.assert_allclose(est["curvature"], curvature, rtol=1e-3, atol=1e-7)


def test_drops_are_held_out_loss_drops_and_restore_the_state():
    model = _model()
    truth = it.Truth(model, LOSS, lr=0.1)
    batches, held = _batches(4, seed=2), _batches(2, seed=5)
    before = [v.numpy() for v in model.weights]
    base_losses = truth.held_loss(held)
    drops, base, by_batch = truth.drops(batches, held)
    for v, w in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w)
    truth.train({1}, batches)
    after = truth.held_loss(held)
    assert by_batch.shape == (len(model.trainable_weights), 2)
    np.testing.assert_allclose(by_batch[1], base_losses - after, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(drops[1], base - after.mean(), rtol=1e-5, atol=1e-7)


def test_summary_picks_by_share_and_bins_by_depth():
    drop = np.array([-0.5, 0.1, 0.2, 0.3])
    estimate = np.array([6.0, 2.0, 1.0, 1.0])  # 60% in tensor 0
    s = report.summarize(drop, {"taylor": estimate}, steps=10, probes=2, bins=2)["taylor"]
    assert s["selection"]["0.5"] == {"tensors": 1, "deepest": 0, "realized_drop": -0.5}
    assert s["selection"]["0.7"]["tensors"] == 2
    assert s["selection"]["0.7"]["realized_drop"] == pytest.approx(-0.4)
    assert s["by_depth"][0]["predicted"] == pytest.approx(8.0 * 10 / 2)
    assert s["by_depth"][1]["realized"] == pytest.approx(0.5)
    assert s["spearman"] == pytest.approx(report.spearman(estimate, drop))
