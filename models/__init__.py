"""Model zoo: `build_model(name_or_path, input_size, num_classes, weights)` -> uncompiled tf_keras.Model.

Built-in names: resnet50, vgg16, mobilenetv2, vit, and smallcnn (random init only, for offline
demos and smoke runs); see models/builders.py and models/vit.py for the structure.  A name ending
in .keras or .h5 is a user's own saved Keras model instead.

weights: "none" (random init), "imagenet" (keras cache ~/.keras/models or $KERAS_HOME/models,
downloaded when online), or a PATH saved with `model.save_weights` (.h5 / TF checkpoint; for vit
also a published-layout .npz).
"""
import common  # noqa: F401  (quiets TF logs; must come first)
from common import UserError

import os

import tf_keras as keras

from models.builders import (  # noqa: F401  (re-exported)
    DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES, MODELS, build_cnn, load_weights_file, one_line, weights_kind,
)
from models.vit import build_vit, load_vit_npz, vit_b16  # noqa: F401  (also registers "vit")

MODEL_NAMES = ("resnet50", "vgg16", "mobilenetv2", "vit", "smallcnn")
assert set(MODEL_NAMES) == set(MODELS), sorted(MODELS)

USER_MODEL_SUFFIXES = (".keras", ".h5")


def is_user_model(name_or_path):
    return os.fspath(name_or_path).lower().endswith(USER_MODEL_SUFFIXES)


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
    builder = MODELS.get_or_fail(name.strip().lower())
    return builder(input_size=DEFAULT_INPUT_SIZE if input_size is None else input_size,
                   num_classes=DEFAULT_NUM_CLASSES if num_classes is None else num_classes,
                   weights=weights)


def build_sized(name_or_path, input_size=None, num_classes=None, weights="none"):
    """build_model, returning (model, input_size, num_classes) as the model really has them:
    a saved model brings its own sizes, which callers need for table paths and data."""
    model = build_model(name_or_path, input_size=input_size, num_classes=num_classes,
                        weights=weights)
    return model, int(model.input_shape[1]), int(model.output_shape[-1])


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
        load_weights_file(model, weights)
    return model
