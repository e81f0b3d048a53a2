"""Build a model by name (models.MODELS) or load a user's saved Keras model; load weight files.

    model = build_model(name_or_path, input_size=224, num_classes=200, weights="none")
"""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import importlib
import os

import tf_keras as keras

from elastictrainer.common import UserError, one_line
from elastictrainer.models import DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES, MODELS, is_user_model
from elastictrainer.models import vit
from elastictrainer.models.base import load_weights_file, weights_kind


def build_model(name_or_path, input_size=None, num_classes=None, weights="none"):
    """Build a built-in model by name, or load a user's saved .keras/.h5 model.

    input_size / num_classes default to 224 / 200 for built-in models. For a user model both come
    from the file: input_size is ignored, and a num_classes that is given and differs from the
    model's output units raises UserError. For a user model "none"/"imagenet" keep the saved
    weights and a PATH loads weights on top.
    """
    name = os.fspath(name_or_path)
    if is_user_model(name):
        return _load_user_model(name, num_classes, weights)
    spec = MODELS.get_or_fail(name.strip().lower())
    module, function = spec.builder.split(":")
    builder = getattr(importlib.import_module(module), function)
    kind = weights_kind(weights)
    model = builder(**spec.kwargs,
                    input_size=DEFAULT_INPUT_SIZE if input_size is None else input_size,
                    num_classes=DEFAULT_NUM_CLASSES if num_classes is None else num_classes,
                    weights="none" if kind == "path" else weights)
    if kind == "path":
        load_weights(model, weights)
    return model


def build_sized(name_or_path, input_size=None, num_classes=None, weights="none"):
    """build_model, returning (model, input_size, num_classes) as the model really has them:
    a saved model brings its own sizes, which callers need for table paths and data."""
    model = build_model(name_or_path, input_size=input_size, num_classes=num_classes,
                        weights=weights)
    return model, int(model.input_shape[1]), int(model.output_shape[-1])


def load_weights(model, path):
    """Weights from a PATH: a published-layout ViT .npz, or what `model.save_weights` wrote."""
    path = os.path.expanduser(os.fspath(path))
    if path.lower().endswith(".npz"):
        if not vit.is_vit(model):
            raise UserError(f"{path}: .npz weights are only supported for the vit model, "
                            f"not {model.name}")
        vit.load_vit_npz(model, path)
        return model
    return load_weights_file(model, path)


def _load_user_model(path, num_classes, weights):
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise UserError(f"model file not found: {path}")
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as e:
        raise UserError(f"cannot load Keras model {path}: {one_line(e)}") from e
    if not isinstance(model, keras.Model) or len(model.outputs or []) != 1:
        raise UserError(f"{path}: expected a Keras model with one output")
    units = model.output_shape[-1]
    if num_classes is not None and units != num_classes:
        raise UserError(f"{path} outputs {units} classes but {num_classes} were requested")
    if weights_kind(weights) == "path":
        load_weights(model, weights)
    return model
