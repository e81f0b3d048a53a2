"""--trial_check (method/trial.py, elastic/realized.py): the trial step, summed over the probes'
batches, stretched and plain, against a naive computation (weights and statistics put back
bit for bit); on the command line, one check per re-selection; refused under a strategy by both
trainers.  And a model whose lowest tensor must move, in model.fit: rho auto, checked or not,
trains it and ends far above the hand-frozen upper layers."""
import numpy as np
import pytest
import tensorflow as tf

from helpers import scripted_table
from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.fit.callback import ElasticCallback


def _bn_model():
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6, activation="relu", name="low")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(h))


@pytest.mark.tf_versions  # control dependencies around variable assignments, per version
def test_the_trial_step_matches_a_naive_computation_and_puts_everything_back():
    import keras

    from elastictrainer.method.trial import TrialStep

    model = _bn_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lr = 0.05
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)  # stretch 1 / (1 - 0.9) = 10
    rng = np.random.default_rng(0)
    batches = [(tf.constant(rng.normal(size=(8, 5)), tf.float32),
                tf.constant(rng.integers(0, 3, 8), tf.int32)) for _ in range(2)]
    passes = []  # the forward passes the trial's graph holds, counted as it is traced

    def loss_of(data):
        passes.append(1)
        return loss_fn(data[1], model(data[0], training=True))

    trial = TrialStep(optimizer, model.trainable_weights, loss_of,
                      stats=model.non_trainable_weights)

    def grads_of(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(batch[1], model(batch[0], training=True))
        return tape.gradient(loss, model.trainable_weights)

    taken = [grads_of(batch) for batch in batches]  # their passes move the statistics
    before = [v.numpy().copy() for v in model.weights]
    masks = [[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1] * 6]
    asked = []

    def refuse(pairs):  # the backtracking's rule, refusing the stretched step's pairs
        asked.append(pairs)
        return False

    got = {}
    for batch, grads in zip(batches, taken):  # every probe's batch and gradients, summed over
        trial.keep(batch, grads)
    got[10], plain = trial.drops(masks)  # no rule: the stretched step's alone
    assert not plain
    assert len(passes) == 2  # L(w), and one pass the loop runs per mask: a graph of two
    for v, w in zip(model.weights, before):  # weights and moving statistics, bit for bit
        np.testing.assert_array_equal(v.numpy(), w)
    assert trial.drops(masks) == (None, False)  # the batches were released
    for batch, grads in zip(batches, taken):
        trial.keep(batch, grads)
    got[1], plain = trial.drops(masks, enough=refuse)  # measured again with the plain step
    assert plain and asked == [got[10]] and len(passes) == 2  # the same graph
    for v, w in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w)

    # naive: on each batch its gradient, each masked step set by hand, the loss on the batch
    for stretch in (10, 1):
        want = [[0.0, 0.0] for _ in masks]
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = loss_fn(batch[1], model(batch[0], training=True))
            grads = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
            model.set_weights(before)
            for k, mask in enumerate(masks):
                base = float(loss_fn(batch[1], model(batch[0], training=True)))
                model.set_weights(before)
                for v, g, m in zip(model.trainable_weights, grads, mask):
                    v.assign(v.numpy() - m * stretch * lr * g)
                after = float(loss_fn(batch[1], model(batch[0], training=True)))
                model.set_weights(before)
                want[k][0] += stretch * lr * sum(float((g * g).sum())
                                                 for g, m in zip(grads, mask) if m)
                want[k][1] += base - after
        for (predicted, realized), (naive_predicted, naive_realized) in zip(got[stretch], want):
            assert predicted == pytest.approx(naive_predicted, rel=1e-5)
            assert realized == pytest.approx(naive_realized, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_a_step_that_moves_nothing_realizes_nothing_under_dropout(flavor):
    """The trial's two losses see one network: a mask that moves no tensor realizes exactly
    0, whatever dropout draws; and the model's own training calls keep their dropout."""
    import importlib

    from elastictrainer import flavors
    from elastictrainer.method.trial import TrialStep

    keras = importlib.import_module(flavor)
    keras.utils.set_random_seed(2)
    inputs = keras.Input((5,))
    h = keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(16, name="low")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(h))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    random_layers = flavors.for_model(model).random_layers(model)
    assert [layer.name for layer in random_layers] == ["drop"]
    trial = TrialStep(keras.optimizers.SGD(0.05, momentum=0.9), model.trainable_weights,
                      lambda data: loss_fn(data[1], model(data[0], training=True)),
                      random_layers=random_layers)
    x = tf.constant(np.random.default_rng(0).normal(size=(16, 5)), tf.float32)
    y = tf.constant(np.arange(16) % 3, tf.int32)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    trial.keep((x, y), tape.gradient(loss, model.trainable_weights))
    ((_, nothing), (_, head)), _ = trial.drops([[0, 0, 0, 0], [0, 0, 1, 1]])
    assert nothing == 0.0 and head != 0.0
    assert float(loss_fn(y, model(x, training=True))) != float(
        loss_fn(y, model(x, training=True)))  # dropout draws again outside the trial


def test_the_command_line_checks_every_re_selection(tmp_path):
    from helpers import tiny_model
    from elastictrainer import cli
    from elastictrainer.runs import loop

    model = tiny_model(num_classes=10, size=16)
    model.save(str(tmp_path / "tiny.keras"))
    table = scripted_table(model, tmp_path / "table.json", 16, 4, "sgd")
    argv = ["--model_name", str(tmp_path / "tiny.keras"), "--dataset_name", "synthetic",
            "--input_size", "16", "--batch_size", "4", "--weights", "none", "--num_epochs", "2",
            "--steps_per_epoch", "4", "--interval", "0.5", "--rho", "auto", "--optimizer",
            "sgd", "--learning_rate", "0.01", "--timing_table", str(table), "--logdir",
            str(tmp_path / "logs"), "--run_name", "checked", "--economy", "false",
            "--head_warmup", "0", "--trial_check", "true", "--quiet"]
    cfg = cli.config_from_args(cli.train_parser().parse_args(argv))
    lines = []
    summary = loop.run(cfg, log=lines.append)
    checks = [line for line in lines if line.startswith("elastic: trial step by depth")]
    assert summary["status"] == "finished"
    assert len(checks) == len(summary["selections"]) == 4  # re-selections at 0, 2, 4, 6
    assert "realizes" in checks[0] and "tensors 0-" in checks[0]


def test_under_a_strategy_both_trainers_refuse_it():
    from types import SimpleNamespace

    import keras
    import tf_keras

    from helpers import tiny_model
    from elastictrainer.fit.steps import FitSteps
    from elastictrainer.method import schemes
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.train.compiled import CompiledSteps

    model = _bn_model()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    with pytest.raises(UserError, match="trial_check steps on one device's batch"):
        FitSteps(model, model.optimizer, "taylor", strategy=object(), trial=True)
    legacy = tiny_model()
    with pytest.raises(UserError, match="--trial_check steps on one device's batch"):
        CompiledSteps(legacy, tf_keras.optimizers.SGD(0.01, momentum=0.9),
                      schemes.SCHEMES["elastic_training"], tensor_roles(legacy),
                      dist=SimpleNamespace(on=True), trial=True)


def _shifted_task():
    """A model pretrained on a label of inputs 0-1, whose lowest kernel then ignores inputs 2-3,
    which the new task's label depends on: only training that kernel can learn it."""
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 6)).astype("float32")
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="low")(inputs)
    h = keras.layers.Dense(8, activation="relu", name="mid")(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(h), name="shifted")
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x, (x[:, 0] + x[:, 1] > 0).astype("int32"), epochs=3, batch_size=32, verbose=0)
    kernel = model.get_layer("low").kernel
    kernel.assign(kernel.numpy() * np.array([[1], [1], [0], [0], [1], [1]], "float32"))
    return model, x, (x[:, 2] - x[:, 3] > 0).astype("int32")


@pytest.mark.parametrize("trial_check", [False, True])
def test_where_the_lowest_tensor_must_move_auto_trains_it_and_beats_the_frozen_stage(
        tmp_path, trial_check):
    model, x, y = _shifted_task()
    weights = model.get_weights()
    table = scripted_table(model, tmp_path / "shifted.json", 6, 32, "sgd")
    model.get_layer("low").trainable = False  # the hand-frozen baseline: upper layers only
    model.compile(model.optimizer.__class__(0.05, momentum=0.9), model.loss,
                  metrics=["accuracy"])
    frozen = model.fit(x, y, epochs=6, batch_size=32, verbose=0).history["accuracy"][-1]
    model.get_layer("low").trainable = True
    model.set_weights(weights)
    model.compile(model.optimizer.__class__(0.05, momentum=0.9), model.loss,
                  metrics=["accuracy"])
    lines = []
    callback = ElasticCallback(rho="auto", interval=1, economy=False, timing_table=table,
                               cache_frozen_prefix=False, log=lines.append,
                               trial_check=trial_check, logdir=str(tmp_path / "auto"))
    auto = model.fit(x, y, epochs=6, batch_size=32, verbose=0,
                     callbacks=[callback]).history["accuracy"][-1]
    selections = runlog.read_summary(str(tmp_path / "auto"))["selections"]
    assert frozen < 0.65  # the upper layers alone cannot see inputs 2-3
    assert any(r["mask"][0] for r in selections)  # the lowest kernel trained
    assert auto > frozen + 0.2
    checks = [line for line in lines if line.startswith("elastic: trial step by depth")]
    assert len(checks) == (sum(r["reason"] == "interval" for r in selections)
                           if trial_check else 0)
