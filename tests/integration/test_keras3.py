"""Keras 3 models (`import keras`, TensorFlow backend) everywhere a tf-keras model goes: their
optimizers' update path (flavors/keras3.py and compat's Keras 3 part) against Keras' own, the
closed-form importance step, profiling with unfused BatchNormalization, every --train_type on a
saved .keras file, a new head and --weights, and which Keras saved a file."""
import json
import zipfile

import numpy as np
import pytest

import keras as keras3
import tensorflow as tf

from helpers import (assert_fresh_step_matches_general_probe, keras3_cnn, scripted_table,
                     updates_by_keras_and_ours)
from elastictrainer import flavors, runlog
from elastictrainer.flavors import compat
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.method import schemes
from elastictrainer.train import compiled
from elastictrainer.errors import UserError
from elastictrainer.method.roles import tensor_roles


pytestmark = pytest.mark.tf_versions


def _data(n=8, size=16, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.uniform(0, 255, (n, size, size, 3)), tf.float32),
            tf.constant(rng.integers(0, classes, n), tf.int32))


OPTIMIZERS = {
    "sgdw_cosine": lambda: keras3.optimizers.SGD(
        keras3.optimizers.schedules.CosineDecay(0.1, 10), momentum=0.9, weight_decay=5e-2),
    "adam": lambda: keras3.optimizers.Adam(0.05),
    "adamw": lambda: keras3.optimizers.AdamW(0.05, weight_decay=0.1),
    "sgd_clipnorm": lambda: keras3.optimizers.SGD(0.1, clipnorm=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_apply_updates_matches_keras3s_apply_gradients(name):
    """The update without merge_call is Keras 3's own, number for number, on a subset too
    (Keras' global bias correction here: per_tensor_bias_correction off)."""
    def model():
        keras3.utils.set_random_seed(1)
        return keras3_cnn()

    def optimizer():
        opt = OPTIMIZERS[name]()
        opt.per_tensor_bias_correction = False
        return opt

    finals = updates_by_keras_and_ours(model, optimizer, *_data())
    for a, b in zip(*finals):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert finals[1][-1] == 4
    np.testing.assert_array_equal(finals[1][0], finals[0][0])


def test_per_tensor_adam_gives_a_late_tensor_adams_first_step():
    """A tensor first trained at step 5 takes Adam's first step, lr sign(g) in size, not one
    scaled by the global step count; make_optimizer's Adam counts per tensor."""
    keras3.utils.set_random_seed(0)
    model = keras3_cnn()
    opt = optimizers.make_optimizer("adam", 1e-3, 0.0, 100, flavor="keras3")
    variables = model.trainable_weights
    optimizers.prepare_optimizer(opt, variables)
    head = train_steps.make_train_step(model, opt, train_steps.make_loss(), variables[-2:])
    for s in range(5):
        head(*_data(seed=s))
    assert [optimizers.tensor_steps(opt, v) for v in variables] == [0] * (len(variables) - 2) + [5, 5]
    kernel = variables[0]
    before = kernel.numpy()
    train_steps.make_train_step(model, opt, train_steps.make_loss(), [kernel])(*_data(seed=9))
    step = np.abs(kernel.numpy() - before)
    moved = step[step > 0]
    np.testing.assert_allclose(moved, 1e-3, rtol=0.02)  # |m / sqrt(v)| = 1 on a first step
    assert optimizers.tensor_steps(opt, kernel) == 1


def _trainer(optimizer, model):
    optimizers.prepare_optimizer(optimizer, model.trainable_weights)
    return compiled.CompiledSteps(model, optimizer, schemes.SCHEMES["elastic_training"],
                           tensor_roles(model))


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw", "clipped"])
def test_taylors_closed_form_step_matches_the_general_probe(kind, monkeypatch):
    """fresh_step's closed form for Keras 3 optimizers against probe_terms, which takes the
    step with the optimizer itself from zeroed slots and restores everything."""
    keras3.utils.set_random_seed(2)
    model = keras3_cnn()
    opt = {"sgd": lambda: optimizers.make_optimizer("sgd", 0.05, 5e-3, 10 ** 6, flavor="keras3"),
           "adam": lambda: optimizers.make_optimizer("adam", 0.05, 0.0, 10 ** 6, flavor="keras3"),
           "adamw": lambda: keras3.optimizers.AdamW(0.05, weight_decay=0.1),
           "clipped": lambda: keras3.optimizers.SGD(0.05, momentum=0.9, clipnorm=1e-3)}[kind]()
    tr = _trainer(opt, model)
    every = range(len(tr.variables))
    for s in range(3):  # training state that a fresh step must ignore
        tr.step_for(every)(*_data(seed=s))
    assert_fresh_step_matches_general_probe(tr, [_data(seed=s) for s in (7, 8)],
                                            kind != "clipped", monkeypatch)


def _live_graphs_after(make_step, selections, warmup=2):
    """How many of the graphs that steps of `selections` traced are still alive once each step
    is dropped, and how many there were; the first `warmup` steps' graphs are not counted (the
    first traces may make what later ones share: Keras 3.3 keeps one of them)."""
    import gc
    import weakref

    x, y = _data()
    graphs = []
    for i, sel in enumerate(selections):
        step = make_step(sel)
        step(x, y)
        if i >= warmup:
            graphs += [weakref.ref(f.graph) for f in compat.concrete_functions(step)]
        del step
    gc.collect()
    return sum(g() is not None for g in graphs), len(graphs)


def test_a_train_step_per_selection_leaves_no_graph_behind():
    """A selection's step traced and dropped frees its graph: through apply_updates nothing
    holds it.  Through Keras 3's own `apply` every one stays alive for good (its merge_call
    keeps the graph it was traced in), which is what the check sees."""
    keras3.utils.set_random_seed(0)
    model = keras3_cnn()
    variables = model.trainable_weights
    opt = optimizers.make_optimizer("adam", 1e-3, 0.0, 100, flavor="keras3")
    optimizers.prepare_optimizer(opt, variables)
    selections = [[variables[k] for k in range(i, len(variables))]
                  for i in range(len(variables))]
    loss_fn = train_steps.make_loss()
    alive, traced = _live_graphs_after(
        lambda sel: train_steps.make_train_step(model, opt, loss_fn, sel), selections)
    assert traced == len(selections) - 2 and alive == 0

    keras_opt = keras3.optimizers.Adam(1e-3)
    keras_opt.build(variables)

    def keras_own_step(sel):
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            keras_opt.apply(tape.gradient(loss, sel), sel)
            return loss
        return step

    alive, traced = _live_graphs_after(keras_own_step, selections)
    assert traced == len(selections) - 2 and alive == traced


# -- compat's Keras 3 part --------------------------------------------------------------------

def test_keras3_private_api_is_there_and_does_what_it_stands_for():
    keras3.utils.set_random_seed(0)
    model = keras3_cnn()
    opt = keras3.optimizers.AdamW(0.1, weight_decay=0.1, clipnorm=1.0)
    opt.build(model.trainable_weights)
    assert compat.keras3_missing_optimizer_api(opt) == []
    keys = [compat.keras3_var_key(opt, v) for v in model.trainable_weights]
    assert len(set(keys)) == len(keys)
    assert all(compat.keras3_knows(opt, v) for v in model.trainable_weights)
    assert not compat.keras3_knows(opt, keras3.Variable(np.zeros(3, "float32")))
    big = [tf.ones([4]) * 10.0]
    assert float(tf.norm(compat.keras3_clip_gradients(opt, big)[0])) == pytest.approx(1.0)
    opt.exclude_from_weight_decay(var_names=["gamma"])
    gammas = [v for v in model.trainable_weights if v.name == "gamma"]
    assert gammas and not any(compat.keras3_use_weight_decay(opt, v) for v in gammas)
    assert compat.keras3_use_weight_decay(opt, model.trainable_weights[0])
    m, v, v_hat = compat.keras3_adam_slots(opt, model.trainable_weights[0])
    assert m.shape == v.shape == model.trainable_weights[0].shape and v_hat is None
    bn = next(layer for layer in model.layers if isinstance(layer, keras3.layers.BatchNormalization))
    assert [w.path for w in compat.keras3_own_trainable_variables(bn)] == \
        [w.path for w in bn.trainable_weights]
    assert compat.keras3_own_trainable_variables(model) == []  # the model made none itself
    layers = compat.keras3_flatten_layers(model)
    assert layers[0] is model and set(model.layers) <= set(layers)
    model.compile(optimizer="sgd", loss=keras3.losses.SparseCategoricalCrossentropy(True))
    x, y = _data()
    model.fit(x, y, epochs=1, verbose=0)
    logged = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    assert float(compat.keras3_loss_tracker(model).result()) == pytest.approx(logged)


# -- models -----------------------------------------------------------------------------------

def test_roles_names_and_random_state_of_a_keras3_model():
    model = keras3_cnn(augment=True)
    flavor = flavors.for_model(model)
    assert flavor.NAME == "keras3"
    assert tensor_roles(model) == ["kernel", "norm", "norm", "kernel", "norm", "norm", "head",
                                   "head"]
    assert [flavors.tensor_name(v) for v in model.trainable_weights][:2] == \
        ["conv2d/kernel", "batch_normalization/gamma"] or \
        all("/" in flavors.tensor_name(v) for v in model.trainable_weights)
    states = flavor.random_state_variables(model)
    assert len(states) == 2  # the flip's generator and the dropout's
    before = [s.numpy().copy() for s in states]
    model(_data()[0], training=True)
    assert any(not np.array_equal(a, s.numpy()) for a, s in zip(before, states))


@pytest.mark.parametrize("fmt", ["keras", "h5"])
def test_which_keras_saved_a_file(tmp_path, fmt):
    from helpers import tiny_model
    paths = {}
    paths["keras3"] = str(tmp_path / f"k3.{fmt}")
    keras3_cnn().save(paths["keras3"])
    paths["tf_keras"] = str(tmp_path / f"k2.{fmt}")
    tiny_model().save(paths["tf_keras"])
    for name, path in paths.items():
        assert flavors.for_file(path).NAME == name
        assert flavors.for_file(path).load_model(path).count_params() > 0
    broken = tmp_path / "other.keras"
    with zipfile.ZipFile(broken, "w") as z:
        z.writestr("config.json", json.dumps({}))
    with pytest.raises(UserError, match="cannot tell which Keras saved"):
        flavors.for_file(str(broken))


def test_profiling_a_keras3_model_attributes_its_unfused_batchnorm():
    """Keras 3 computes BatchNormalization from its parts: the dataflow attribution still
    charges every traced backward op to tensors, and the optimizer's slots (named
    after the weights' paths) to their tensors."""
    from elastictrainer.profiler import run as prun
    from elastictrainer.profiler.dataflow import slot_owners
    model = keras3_cnn(num_classes=4, size=32)
    table = prun.profile_model(model, "k3cnn", 32, 8, 4, num_iterations=3, warmup=1,
                               progress=False, optimizer="adam")
    assert table["unattributed"] == [] and table["coverage"] == 1.0
    assert [t["name"] for t in table["tensors"]] == [flavors.tensor_name(v)
                                                     for v in model.trainable_weights]
    assert all(t["t_dw_ms"] >= 0 and t["t_dy_ms"] >= 0 for t in table["tensors"])
    opt = optimizers.make_optimizer("adam", 1e-3, 0.0, 10, flavor="keras3")
    optimizers.prepare_optimizer(opt, model.trainable_weights)
    owners = slot_owners(model.trainable_weights, opt.variables)
    assert sorted(k for _, k in owners) == sorted(list(range(8)) * 3)  # m, v, step count


# -- the command line on a saved Keras 3 model ------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k3")
    keras3.utils.set_random_seed(0)
    model = keras3_cnn(num_classes=7)
    model.save(str(tmp / "k3cnn.keras"))
    model.save_weights(str(tmp / "k3cnn7.weights.h5"))
    # the runs train it with a 10-way head (synthetic's classes); scripted times, so that
    # under rho 0.6 a selection trains some tensors and never all, on any machine
    scripted_table(keras3_cnn(num_classes=10), tmp / "table.json", 16, 16, "sgd")
    return tmp, model


def _train(tmp, train_type, name, *extra):
    import main as main_cli
    return main_cli.main([
        "--model_name", str(tmp / "k3cnn.keras"), "--input_size", "16", "--dataset_name",
        "synthetic", "--num_train", "96", "--num_test", "32", "--batch_size", "16",
        "--num_epochs", "2", "--interval", "1", "--train_type", train_type, "--rho", "0.6",
        "--economy", "false", "--timing_table", str(tmp / "table.json"),
        # 6 steps an epoch: cached, the first epoch would fill the cache and leave the closed
        # loop too few steps to measure a ratio (the cache's Keras 3 runs: test_prefix_cache)
        "--cache_frozen_prefix", "false",
        "--logdir", str(tmp / "logs"), "--run_name", name, "--quiet"] + list(extra))


# every scheme but the two ablations, |w| and |g|, whose importance is flavour-free arithmetic
# on the weights and the probe's gradients that elastic_training reads as well
# (integration/test_train.py trains every scheme on a tf-keras model)
ABLATIONS = ("elastic_training_weight_magnitude", "elastic_training_grad_magnitude")
KERAS3_SCHEMES = [s for s in schemes.SCHEMES if s not in ABLATIONS]


@pytest.mark.parametrize("train_type", KERAS3_SCHEMES)
def test_each_scheme_trains_a_saved_keras3_model(saved, train_type):
    tmp, _ = saved
    assert _train(tmp, train_type, train_type) == 0
    summary = runlog.read_summary(str(tmp / "logs" / train_type))
    assert summary["status"] == "finished" and len(summary["epochs"]) == 2
    assert summary["num_tensors"] == 8 and summary["tensor_names"][0].endswith("/kernel")
    trained = summary["epochs"][-1]["selected"]
    expected = {"full_training": 8, "traditional_tl_training": 2, "bn_plus_bias_training": 6,
                "prunetrain": 8}
    if train_type in expected:
        assert trained == expected[train_type]
    else:  # the table's budget under rho 0.6 holds some tensors, never all
        assert 1 <= trained < 8 and summary["measured_ratio"] is not None


def test_a_new_head_and_weights_from_a_file_with_another_class_count(saved):
    """The saved 7-way model trained on 10 classes: a new 10-way head, and --weights of the
    7-way model loads every weight but the classifier."""
    from elastictrainer.models.build import build_model
    tmp, model = saved
    logs = []
    new = build_model(str(tmp / "k3cnn.keras"), num_classes=10,
                      weights=str(tmp / "k3cnn7.weights.h5"), log=logs.append)
    assert new.output_shape[-1] == 10 and flavors.for_model(new).NAME == "keras3"
    assert any("replaced its 7-way output layer" in line for line in logs)
    assert any("loaded everything but the classifier" in line for line in logs)
    for a, b in zip(model.trainable_weights[:-2], new.trainable_weights[:-2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
