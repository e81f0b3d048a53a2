"""The two Kerases a model may belong to, one module each: tf-keras (`import tf_keras as keras`,
the built-in models') and Keras 3 (`import keras` on TensorFlow >= 2.16, its TensorFlow
backend).  A model, an optimizer or a saved file says which it is; the user never does.

Each flavor module provides the same functions: make_optimizer, check_optimizer,
prepare_optimizer, apply_updates, tensor_steps, fresh_step_supported, fresh_step (the optimizer's
side); is_model, is_optimizer (detection).  Importing this package imports neither Keras.
"""
import importlib

from elastictrainer.common import Registry, UserError

FLAVORS = Registry("Keras")
FLAVORS["tf_keras"] = "elastictrainer.flavors.tf_keras"
FLAVORS["keras3"] = "elastictrainer.flavors.keras3"


def get(name):
    """The flavor module called `name` (FLAVORS)."""
    return importlib.import_module(FLAVORS.get_or_fail(name))


def _detect(obj, test, what):
    for name in FLAVORS:
        module = get(name)
        if getattr(module, test)(obj):
            return module
    raise UserError(f"{what} {type(obj).__module__}.{type(obj).__name__} is neither a tf_keras "
                    f"nor a Keras 3 one (tf_keras.optimizers.legacy and other optimizers are "
                    f"not supported)" if what == "optimizer" else
                    f"{what} {type(obj).__module__}.{type(obj).__name__} is neither a tf_keras "
                    f"nor a Keras 3 Model")


def for_model(model):
    """The flavor module of a Keras model (UserError for anything else)."""
    return _detect(model, "is_model", "model")


def for_optimizer(optimizer):
    """The flavor module of a Keras optimizer (UserError for anything else)."""
    return _detect(optimizer, "is_optimizer", "optimizer")
