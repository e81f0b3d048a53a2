"""Tensor importance (importance.py) and Adam's per-tensor bias correction (train_steps.py): the
estimate elastic_training uses ranks tensors by the loss drop their training really brings, and
does not collapse over a 12-epoch run of smallcnn."""
import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

from helpers import (assert_fresh_step_matches_general_probe, batch, paper_taylor_by_hand,
                     scripted_table, snapshot, tiny_model)
from elastictrainer import config
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.method import importance
from elastictrainer.runs import loop
from elastictrainer.method import schemes
from elastictrainer.train import compiled
from elastictrainer.data.loaders import synthetic_dataset
from elastictrainer.method.roles import tensor_roles



def spearman(a, b):
    """Rank correlation (no ties in these measurements)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


# ------------------------------------------------------------- Adam, bias correction per tensor
def _adam_run(per_tensor, xla, grads_a, grads_b, frozen_steps):
    """a trains at every step; b joins after `frozen_steps` (as a newly selected tensor)."""
    a = tf.Variable(np.linspace(-1, 1, 6, dtype=np.float32))
    b = tf.Variable(np.linspace(1, -1, 4, dtype=np.float32))
    opt = keras.optimizers.Adam(0.01)
    opt.per_tensor_bias_correction = per_tensor
    optimizers.prepare_optimizer(opt, [a, b])
    opt.jit_compile = xla

    @tf.function
    def step(ga, gb=None):
        if gb is None:
            optimizers.apply_updates(opt, [ga], [a])
        else:
            optimizers.apply_updates(opt, [ga, gb], [a, b])

    for t, ga in enumerate(grads_a):
        if t < frozen_steps:
            step(tf.constant(ga))
        else:
            step(tf.constant(ga), tf.constant(grads_b[t - frozen_steps]))
    return a, b, opt


def _plain_adam(init, grads):
    v = tf.Variable(init)
    opt = keras.optimizers.Adam(0.01)
    for g in grads:
        opt.apply_gradients([(tf.constant(g), v)])
    return v.numpy()


@pytest.mark.parametrize("xla", [False, True])
def test_per_tensor_adam_is_plain_adam_for_each_tensor_from_its_own_first_step(xla):
    rng = np.random.default_rng(0)
    frozen, joined = 300, 5
    grads_a = rng.normal(size=(frozen + joined, 6)).astype(np.float32)
    grads_b = rng.normal(size=(joined, 4)).astype(np.float32)
    a_var, b_var, opt = _adam_run(True, xla, grads_a, grads_b, frozen)
    a, b = a_var.numpy(), b_var.numpy()
    # trained from step one: exactly Keras' Adam
    np.testing.assert_allclose(a, _plain_adam(np.linspace(-1, 1, 6, dtype=np.float32), grads_a),
                               rtol=1e-5, atol=1e-6)
    # joined at global step 300: the steps Adam intends for its first 5 steps
    b_ref = _plain_adam(np.linspace(1, -1, 4, dtype=np.float32), grads_b)
    np.testing.assert_allclose(b, b_ref, rtol=1e-5, atol=1e-6)
    assert opt.iterations.numpy() == frozen + joined
    assert optimizers.tensor_steps(opt, b_var) == joined
    # Keras' global count instead: b's steps are sqrt(1 - 0.999^301) / 0.1 x sqrt(0.001)
    # = 2.1 times larger at first
    b_global = _adam_run(False, xla, grads_a, grads_b, frozen)[1].numpy()
    b0 = np.linspace(1, -1, 4, dtype=np.float32)
    ratio = np.abs(b_global - b0).mean() / np.abs(b_ref - b0).mean()
    assert ratio > 1.5


def test_make_optimizer_counts_adam_steps_per_tensor_and_sgd_has_no_counts():
    model = tiny_model()
    adam = optimizers.prepare_optimizer(optimizers.make_optimizer("adam", 1e-3, 0, 10),
                                    model.trainable_weights)
    assert optimizers.tensor_steps(adam, model.trainable_weights[0]) == 0
    assert any(v.name.startswith("tensor_steps/") for v in adam.variables)
    off = optimizers.prepare_optimizer(
        optimizers.make_optimizer("adam", 1e-3, 0, 10, per_tensor_bias_correction=False),
        model.trainable_weights)
    assert optimizers.tensor_steps(off, model.trainable_weights[0]) is None
    sgd = optimizers.prepare_optimizer(optimizers.make_optimizer("sgd", 1e-3, 5e-4, 10),
                                   model.trainable_weights)
    assert optimizers.tensor_steps(sgd, model.trainable_weights[0]) is None


# ------------------------------------------------------------- estimators
def _trainer(optimizer, model=None):
    model = model or tiny_model()
    return compiled.CompiledSteps(model, optimizer, schemes.SCHEMES["elastic_training"],
                           tensor_roles(model))


def _grads(model, x, y):
    with tf.GradientTape() as tape:
        loss = train_steps.make_loss()(y, model(x, training=True))
    return [g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_weights)]


def test_probes_restore_weights_and_adam_state_bit_identical():
    tr = _trainer(optimizers.make_optimizer("adam", 3e-3, 0, 100))
    data = [batch(seed=s) for s in range(4)]
    tr.step_for(range(len(tr.variables)))(*data[0])
    tr.step_for((6, 7))(*data[1])  # the head ahead of the rest: per-tensor counts differ
    w0, o0 = snapshot(tr.variables), snapshot(tr.optimizer.variables)
    for name in ("taylor", "taylor_paper"):
        imp = importance.IMPORTANCE[name](tr, data[2:])
        assert imp.shape == (8,) and np.all(np.isfinite(imp))
    assert all(np.array_equal(a, b) for a, b in zip(w0, snapshot(tr.variables)))
    assert all(np.array_equal(a, b) for a, b in zip(o0, snapshot(tr.optimizer.variables)))
    assert optimizers.tensor_steps(tr.optimizer, tr.variables[0]) == 1
    assert optimizers.tensor_steps(tr.optimizer, tr.variables[7]) == 2


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_taylor_is_the_first_order_drop_of_a_fresh_optimizer_step(opt):
    """I_k = -g(w).dw0 with dw0 the step from zeroed optimizer slots, whatever state training
    left: SGD's momentum and Adam's moments do not enter."""
    keras.utils.set_random_seed(1)
    model = tiny_model()
    lr, wd = 0.01, 5e-4
    tr = _trainer(optimizers.make_optimizer(opt, lr, wd, 10 ** 6), model)
    for s in range(3):
        tr.step_for(range(8))(*batch(seed=s))
    x, y = batch(seed=9)
    bn0 = snapshot(model.non_trainable_weights)
    g = _grads(model, x, y)
    for v, w in zip(model.non_trainable_weights, bn0):
        v.assign(w)
    w = [v.numpy().astype(np.float64) for v in model.trainable_weights]
    lr_t = float(tr.optimizer.learning_rate)  # the schedule at the current step
    if opt == "sgd":
        naive = [lr_t * np.sum(gk * gk + wd * gk * wk) for gk, wk in zip(g, w)]
    else:  # Adam's first step: lr g / (|g| + eps'), eps' = eps / sqrt(1 - beta2) before 2.17
        eps = 1e-7 if getattr(tr.optimizer, "adaptive_epsilon", False) else 1e-7 / np.sqrt(1e-3)
        naive = [lr_t * np.sum(gk * gk / (np.abs(gk) + eps)) for gk in g]
    fast = importance.taylor_importance(tr, [(x, y)])
    # c1's bias feeds a BatchNorm on batch statistics, so its true gradient is zero and both
    # sides hold rounding residue (~1e-10 here, 1e-8 of the largest); which residue depends on
    # the CPU's kernels (an AVX-512 machine gave 3.6e-10 against 8.8e-10)
    np.testing.assert_allclose(fast, naive, rtol=2e-3, atol=1e-7 * max(naive))
    assert np.all(fast > 0)


def _optimizer(kind):
    if kind in ("sgd", "adam"):
        return optimizers.make_optimizer(kind, 0.05, 5e-3, 10 ** 6)
    if kind == "sgd_nesterov":
        return keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=5e-3)
    if kind == "sgd_plain":
        return keras.optimizers.SGD(0.05)
    return keras.optimizers.SGD(0.05, momentum=0.9, clipnorm=1e-3)  # not covered: general path


@pytest.mark.parametrize("kind", ["sgd", "adam", "sgd_nesterov", "sgd_plain", "clipped"])
def test_taylors_closed_form_step_matches_the_general_probe(kind, monkeypatch):
    """optimizers.fresh_step (no snapshot, update or restore) against probe_terms, which takes the
    step with the optimizer itself from zeroed slots and restores everything."""
    keras.utils.set_random_seed(2)
    tr = _trainer(_optimizer(kind))
    for s in range(3):  # training state that a fresh step must ignore
        tr.step_for(range(8))(*batch(seed=s))
    tr.step_for((6, 7))(*batch(seed=3))
    assert_fresh_step_matches_general_probe(tr, [batch(seed=s) for s in (7, 8)],
                                            kind != "clipped", monkeypatch)


def test_taylor_paper_is_eq_6_from_trainings_optimizer_state():
    """I_k = -g(w + dw).dw with dw SGD's step with its momentum, by hand."""
    keras.utils.set_random_seed(3)
    model = tiny_model()
    tr = _trainer(keras.optimizers.SGD(0.05, momentum=0.9), model)
    for s in range(2):
        tr.step_for(range(8))(*batch(seed=s))
    momenta = [tr.optimizer.momentums[k].numpy() for k in range(8)]
    x, y = batch(seed=11)
    naive = paper_taylor_by_hand(model, lambda: _grads(model, x, y),
                                 lambda g0: [0.9 * m - 0.05 * g for m, g in zip(momenta, g0)])
    fast = importance.taylor_paper_importance(tr, [(x, y)])
    np.testing.assert_allclose(fast, naive, rtol=2e-2, atol=1e-9)


# ------------------------------------------------------------- against measured loss drops
@pytest.mark.parametrize("opt,lr", [("sgd", 0.01), ("adam", 3e-3)])
def test_taylor_ranks_tensors_by_the_loss_drop_their_training_brings(opt, lr):
    """Each tensor of a tiny model trained alone for 16 steps from the state an elastic run
    leaves (the output-side tensors trained, the rest not yet): the estimate on 4 probe
    batches ranks the tensors as their held-out loss drops do."""
    data = synthetic_dataset(input_size=16, batch_size=8, seed=0, num_test=256)
    it = iter(data.train.repeat())
    pool = [next(it) for _ in range(36)]
    held = list(data.test)
    keras.utils.set_random_seed(0)
    model = tiny_model()
    tr = _trainer(optimizers.make_optimizer(opt, lr, 5e-4, 1000), model)
    tr.steps.maxsize = 16
    for x, y in pool[:16]:
        tr.step_for((4, 5, 6, 7))(x, y)

    def held_loss():
        return sum(float(tr.eval_fn(x, y)[0]) for x, y in held) / 256

    w0, o0 = snapshot(model.weights), snapshot(tr.optimizer.variables)

    def restore():
        for v, w in zip(model.weights + tr.optimizer.variables, w0 + o0):
            v.assign(w)

    loss0, drops = held_loss(), []
    for k in range(8):
        restore()
        for x, y in pool[16:32]:
            tr.step_for((k,))(x, y)
        drops.append(loss0 - held_loss())
    restore()
    assert sum(d > 0 for d in drops) >= 6  # training helps: there is something to rank
    estimate = importance.taylor_importance(tr, pool[32:36])
    assert spearman(estimate, drops) > 0.6, (estimate, drops)


def test_no_collapse_over_12_epochs_of_smallcnn(tmp_path):
    """smallcnn from random weights (Adam 3e-3, rho 0.6), 16 steps an epoch: the paper's estimate
    (elastic_training_taylor_paper) scores fewer and fewer of the 20 tensors positive at the three
    selections (16, 4, then 3 in one measurement, training 10, 4, then 2); elastic_training's keeps
    all 20 positive and the budget used."""
    from elastictrainer.models.build import build_sized
    from elastictrainer.profiler import table as ptable
    path = str(tmp_path / "smallcnn.json")
    model, _, _ = build_sized("smallcnn", 32, 10, progress=False)
    table = ptable.load_table(scripted_table(model, path, 32, 8, "adam"))
    # The model's tensors and ranks with fixed times, so that what the selections train
    # depends on the importance alone, not on how busy the machine was while profiling:
    # per tensor t_dw and t_dy of 1-4 ms, the forward pass 0.35 of a step, the update a tenth,
    # a selection's compile 24 full steps (this configuration's profile on a 2-core machine),
    # no calibration.
    rng = np.random.default_rng(0)
    for t in table["tensors"]:
        t["t_dw_ms"], t["t_dy_ms"] = float(rng.uniform(1, 4)), float(rng.uniform(1, 4))
    backward = sum(t["t_dw_ms"] + t["t_dy_ms"] for t in table["tensors"])
    table["t_fp_ms"] = 0.35 / 0.65 * backward
    table["t_full_ms"] = table["t_fp_ms"] + backward
    table["t_bp_ms"] = backward
    table["t_grads_ms"] = 0.9 * table["t_full_ms"]
    table["compile_ms"] = 24 * table["t_full_ms"]
    table["calibration"] = None
    ptable.save_table(table, path)
    cfg = config.Config(model_name="smallcnn", weights="none", dataset_name="synthetic",
                        input_size=32, batch_size=8, optimizer="adam", learning_rate=0.003,
                        rho=0.6, num_epochs=12, steps_per_epoch=16, progress=False,
                        rho_feedback=False,  # selections from importance and table alone
                        economy=False,  # every re-selection, whatever a compile costs
                        head_warmup=0.0,  # the paper's schedule: probes at step 0
                        logdir=str(tmp_path / "logs"), run_name="smallcnn",
                        timing_table=path)
    summary = loop.run(cfg, log=lambda msg: None)
    selections = summary["selections"]
    # re-selections at epochs 0, 4 and 8, each selection training after its probe step
    assert [s["step"] for s in selections] == [1, 65, 129]
    for s in selections:
        assert sum(v > 0 for v in s["importance"]) >= 15
        # what stopped the selection is the time budget, never a lack of tensors worth training
        assert s["limited_by"] == "budget" and sum(s["mask"]) >= 2


# ------------------------------------------------------------- curvature (taylor_curvature)
def test_curvature_terms_match_a_finite_difference_and_restore_the_statistics():
    """importance.CurvatureTerms against a naive reference: s(-g.dw0) - s^2/2 e_k dw0_k.(H v)_k,
    v = sum_j e_j dw0_j, H v by central differences of the gradient; the BatchNorm statistics
    its forward pass moves are put back bit for bit."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(5, input_shape=(3,)),
                              keras.layers.BatchNormalization(), keras.layers.Activation("tanh"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.1, momentum=0.75)
    variables = list(model.trainable_weights)
    optimizers.prepare_optimizer(opt, variables)
    terms = importance.in_step_terms("taylor_curvature", opt, variables)
    terms.stats = list(model.non_trainable_weights)
    loss_fn = train_steps.make_loss()
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(8, 3)), tf.float32)
    y = tf.constant(rng.integers(0, 2, 8))

    def loss_of(data):
        return loss_fn(data[1], model(data[0], training=True))

    def grads_at():
        with tf.GradientTape() as tape:
            loss = loss_of((x, y))
        return tape.gradient(loss, variables)

    signs = tf.constant([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    g = grads_at()  # (its forward pass moves the statistics: before, not during)
    before = [v.numpy() for v in model.weights]
    hvp_at = importance.hessian_vector_product(loss_of, variables)
    got = tf.function(lambda: terms(g, hvp_at, (x, y), signs))().numpy()
    for v, w in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w)
    s, h = 4.0, 1e-2  # 1 / (1 - 0.75); the difference's step
    g = [t.numpy().astype(np.float64) for t in g]
    dw = [-0.1 * t for t in g]  # a fresh SGD step
    vec = [e * d for e, d in zip(signs.numpy(), dw)]
    norms = model.non_trainable_weights

    def grads_moved(sign):
        for v, d in zip(variables, vec):
            v.assign((v.numpy() + sign * h * d).astype(np.float32))
        out = [t.numpy().astype(np.float64) for t in grads_at()]
        for v, d in zip(variables, vec):
            v.assign((v.numpy() - sign * h * d).astype(np.float32))
        return out

    plus, minus = grads_moved(1.0), grads_moved(-1.0)
    hv = [(a - b) / (2 * h) for a, b in zip(plus, minus)]
    want = [s * -np.sum(a * d) - 0.5 * s * s * e * np.sum(d * p)
            for a, d, p, e in zip(g, dw, hv, signs.numpy())]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-6)
    assert terms.stretch == s
