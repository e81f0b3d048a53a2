"""train_steps.py and flavors/: optimizers and versions they refuse in one line, and the setting that keeps
autograph off tf_keras; updates computed for real are integration/test_engine.py's."""
import pytest

import tf_keras as keras

from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from helpers import tiny_mlp


def test_an_unknown_lr_schedule_is_refused_in_one_line():
    from elastictrainer.errors import UserError
    from elastictrainer.config import Config
    with pytest.raises(UserError, match="--lr_schedule 'step'; valid: cosine, constant"):
        Config(lr_schedule="step").validate()


def test_unsupported_optimizers_and_versions_are_refused_in_one_line(monkeypatch):
    from elastictrainer.errors import UserError

    model = tiny_mlp(0)
    with pytest.raises(UserError, match="use_ema"):
        optimizers.prepare_optimizer(keras.optimizers.SGD(0.1, use_ema=True), model.trainable_weights)
    with pytest.raises(UserError, match="legacy and other optimizers are not supported"):
        optimizers.prepare_optimizer(keras.optimizers.legacy.SGD(0.1), model.trainable_weights)
    monkeypatch.setattr(train_steps.keras, "__version__", "2.99.0")
    with pytest.raises(UserError, match=r"tf-keras 2\.99\.0 is outside .*\(2\.16 to 2\.21\)"):
        optimizers.prepare_optimizer(keras.optimizers.SGD(0.1), model.trainable_weights)


def test_autograph_leaves_tf_keras_unconverted_on_every_supported_tensorflow():
    """Without that rule TF 2.16 transpiles tf_keras at every new train step (15 s instead of
    1 s)."""
    from tensorflow.python.autograph.core import config as ag_config

    assert any(getattr(r, "_prefix", None) == "tf_keras" for r in ag_config.CONVERSION_RULES)


def test_keras3_optimizers_and_versions_are_refused_in_one_line(monkeypatch):
    import keras as keras3

    from elastictrainer.errors import UserError
    from elastictrainer.flavors import keras3 as flavor

    model = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(3)])
    variables = model.trainable_weights
    with pytest.raises(UserError, match="use_ema"):
        optimizers.prepare_optimizer(keras3.optimizers.SGD(0.1, use_ema=True), variables)
    with pytest.raises(UserError, match="gradient_accumulation_steps"):
        optimizers.prepare_optimizer(keras3.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                                 variables)
    other = keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(3)])
    built = keras3.optimizers.SGD(0.1)
    built.build(other.trainable_weights)
    with pytest.raises(UserError, match="built for other variables"):
        optimizers.prepare_optimizer(built, variables)
    monkeypatch.setattr(flavor.keras, "__version__", "3.99.0")
    lo, hi = (".".join(map(str, v)) for v in flavor.TESTED_KERAS)
    with pytest.raises(UserError, match=rf"Keras 3\.99\.0 is outside .*\({lo} to {hi}\)"):
        optimizers.prepare_optimizer(keras3.optimizers.SGD(0.1), variables)
