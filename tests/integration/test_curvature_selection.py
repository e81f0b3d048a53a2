"""elastic_training_curvature (importance.CurvatureTerms) in a run: on a model whose lowest
tensor has by far the largest gradient but whose loss falls only when the upper tensors train
(its input is large, so the optimizer's step on that tensor overshoots), the first-order
estimate selects the lowest tensor first and the curvature-aware one never does; under a
tf.distribute strategy both trainers refuse it in one line."""
import numpy as np
import pytest
import tensorflow as tf

from helpers import scripted_table
from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.fit.callback import ElasticCallback


def _model():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(8, name="low", kernel_initializer=keras.initializers.RandomNormal(
        stddev=0.001))(inputs)
    h = keras.layers.Dense(8, activation="tanh", name="mid")(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(h), name="overshoot")
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data():
    rng = np.random.default_rng(0)
    x = (100 * rng.normal(size=(256, 4))).astype("float32")  # large: the low step overshoots
    y = (x[:, 1] > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def _first_selection(tmp_path, train_type):
    model = _model()
    table = scripted_table(model, tmp_path / f"{train_type}.json", 4, 16, "sgd")
    callback = ElasticCallback(rho="auto", interval=1, economy=False, train_type=train_type,
                               timing_table=table, cache_frozen_prefix=False, log=None,
                               logdir=str(tmp_path / train_type))
    model.fit(_data(), epochs=2, verbose=0, callbacks=[callback])
    records = runlog.read_summary(str(tmp_path / train_type))["selections"]
    return [r for r in records if r["reason"] != "head warm-up"]


@pytest.mark.tf_versions  # model.fit's probe with a batch-bound terms function, per version
def test_the_curvature_estimate_leaves_the_overshooting_tensor_out(tmp_path):
    first_order = _first_selection(tmp_path, "elastic_training")
    curvature = _first_selection(tmp_path, "elastic_training_curvature")
    assert first_order[0]["mask"][0] == 1  # the low kernel: the largest |g|^2 by far
    for record in curvature:  # every selection, from the first on, leaves it out
        assert record["mask"][0] == 0 and any(record["mask"])
    assert curvature[0]["importance"][0] < 0  # its step raises the loss: a negative estimate


def test_under_a_strategy_it_is_refused():
    from elastictrainer.fit.steps import FitSteps

    model = _model()
    with pytest.raises(UserError, match="second gradient on one device's batch"):
        FitSteps(model, model.optimizer, "taylor_curvature", strategy=object())


def test_under_a_strategy_the_command_lines_trainer_refuses_it_at_once():
    from types import SimpleNamespace

    import tf_keras as keras

    from helpers import tiny_model
    from elastictrainer.method import schemes
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.train.compiled import CompiledSteps

    model = tiny_model()
    with pytest.raises(UserError, match="elastic_training_curvature takes a second gradient"):
        CompiledSteps(model, keras.optimizers.SGD(0.01, momentum=0.9),
                      schemes.SCHEMES["elastic_training_curvature"], tensor_roles(model),
                      dist=SimpleNamespace(on=True))
