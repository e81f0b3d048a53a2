"""The two Kerases a model may belong to, one module each: tf-keras (`import tf_keras as keras`,
the built-in models') and Keras 3 (`import keras` on TensorFlow >= 2.16, its TensorFlow
backend).  A model, an optimizer or a saved file says which it is; the user never does.

Each flavor module provides the same functions: make_optimizer, check_optimizer,
prepare_optimizer, the update's parts (begin_update, prepare_gradients, update_variable,
finish_update: optimizers.apply_updates puts them together), tensor_steps, fresh_step_supported,
fresh_step (the optimizer's side); a model's layers, names, random state and loading; its
functional graph (is_functional, graph_calls, call_mode, graph_input, functional_model:
prefix/graph.py); model.fit's step parts; is_model, is_optimizer (detection).  Importing this package imports neither Keras.
"""
import importlib

from elastictrainer.errors import Registry, UserError

FLAVORS = Registry("Keras")
FLAVORS["tf_keras"] = "elastictrainer.flavors.tf_keras"
FLAVORS["keras3"] = "elastictrainer.flavors.keras3"


_LOADED = {}


def get(name):
    """The flavor module called `name` (FLAVORS).  Cached: detection runs inside traced
    functions too, where AutoGraph would try to convert importlib."""
    module = _LOADED.get(name)
    if module is None:
        module = _LOADED[name] = importlib.import_module(FLAVORS.get_or_fail(name))
    return module


# The top-level module each flavor's objects come from: an object of a Keras that is not
# imported cannot be one of its objects, so detection never imports one.
_KERAS_MODULE = {"tf_keras": "tf_keras", "keras3": "keras"}


def _detect(obj, test, what):
    import sys

    for name in FLAVORS:
        if sys.modules.get(_KERAS_MODULE[name]) is None:
            continue
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


def is_model(obj):
    """Whether `obj` is a Keras model of either flavor (imports only the Keras already loaded:
    an object of a Keras not imported cannot be one of its models)."""
    import sys

    return any(sys.modules.get(m) is not None and get(name).is_model(obj)
               for name, m in _KERAS_MODULE.items())


def tensor_name(variable):
    """The name tables and summaries give a trainable tensor, whichever its Keras: a Keras 3
    variable's path ('dense/kernel'), a tf-keras one's name ('dense/kernel:0')."""
    path = getattr(variable, "path", None)
    return path if isinstance(path, str) else variable.name


def for_file(path):
    """The flavor of a saved model file: a .keras archive says which Keras wrote it in its
    metadata.json, an HDF5 file in its `keras_version` attribute; a SavedModel directory is
    tf-keras's."""
    import json
    import os
    import zipfile

    version = None
    if os.path.isdir(path):
        return get("tf_keras")
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get("keras_version")
        else:
            import h5py

            with h5py.File(path, "r") as f:
                version = f.attrs.get("keras_version")
                version = version.decode() if isinstance(version, bytes) else version
    except (OSError, KeyError, ValueError):
        version = None
    if version is None:
        raise UserError(f"cannot tell which Keras saved {path}: no Keras version in the file "
                        f"(a .keras archive or an .h5 file saved by Keras is expected)")
    return get("keras3" if str(version).startswith("3.") else "tf_keras")


def set_random_seed(seed):
    """Seed Python, NumPy, TensorFlow and every Keras loaded (Keras 3 keeps a global seed
    generator of its own)."""
    import sys

    for name, module in _KERAS_MODULE.items():
        if sys.modules.get(module) is not None:
            get(name).set_random_seed(seed)
