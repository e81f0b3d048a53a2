"""engine.py: optimizers and versions it refuses in one line, and the setting that keeps
autograph off tf_keras; updates computed for real are integration/test_engine.py's."""
import pytest

import tf_keras as keras

from elastictrainer import engine
from helpers import tiny_mlp


def test_an_unknown_lr_schedule_is_refused_in_one_line():
    from elastictrainer.common import UserError
    from elastictrainer.config import Config
    with pytest.raises(UserError, match="--lr_schedule 'step'; valid: cosine, constant"):
        Config(lr_schedule="step").validate()


def test_unsupported_optimizers_and_versions_are_refused_in_one_line(monkeypatch):
    from elastictrainer.common import UserError

    model = tiny_mlp(0)
    with pytest.raises(UserError, match="use_ema"):
        engine.prepare_optimizer(keras.optimizers.SGD(0.1, use_ema=True), model.trainable_weights)
    with pytest.raises(UserError, match="only tf_keras.optimizers"):
        engine.prepare_optimizer(keras.optimizers.legacy.SGD(0.1), model.trainable_weights)
    monkeypatch.setattr(engine.keras, "__version__", "2.99.0")
    with pytest.raises(UserError, match=r"tf-keras 2\.99\.0 is outside .*\(2\.16 to 2\.21\)"):
        engine.prepare_optimizer(keras.optimizers.SGD(0.1), model.trainable_weights)


def test_autograph_leaves_tf_keras_unconverted_on_every_supported_tensorflow():
    """Without that rule TF 2.16 transpiles tf_keras at every new train step (15 s instead of
    1 s)."""
    from tensorflow.python.autograph.core import config as ag_config

    assert any(getattr(r, "_prefix", None) == "tf_keras" for r in ag_config.CONVERSION_RULES)
