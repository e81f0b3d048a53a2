"""Timing tables kept for the life of this process, for the next run of the same model and
shapes in it.

A benchmark, or several model.fit calls with ElasticCallback, run many elastic runs in one
process; each would profile the same configuration again wherever its table path is new.  This
keeps every table profiled or loaded here under a key of everything that makes a table valid
for a run: the model's architecture (its layers' classes and configurations, layer names
replaced by their positions, since Keras numbers the layers of every model it builds, and its
trainable tensors' shapes and dtypes), what the caller adds (input size, batch size, classes,
optimizer, loss, the profiler's settings), and the TensorFlow and Keras versions and the devices.
The tables on disk (profiles/) serve runs of other processes; this one is in memory only.
"""
import copy
import hashlib
import json

import tensorflow as tf

from elastictrainer import flavors

_TABLES = {}


def describe(obj):
    """A JSON-able description of an optimizer or a loss as far as it shapes a training step:
    its class and configuration (without its name and learning rate, which change no op), or
    the name of a function, or the string it is."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [describe(o) for o in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    try:
        config = obj.get_config()
    except Exception:  # noqa: BLE001  (a plain function, or an object without a config)
        return getattr(obj, "__qualname__", kind)
    config = {k: v for k, v in config.items() if k not in ("name", "learning_rate")}
    extra = getattr(obj, "per_tensor_bias_correction", None)  # the profiler copies it too
    return [kind, _plain(config), extra]


def model_fingerprint(model):
    """A digest of `model`'s architecture, the same for the same model built again."""
    flavor = flavors.for_model(model)
    layers = flavor.layers(model)
    position = {layer.name: f"#{k}" for k, layer in enumerate(layers)}
    parts = [[f"{type(layer).__module__}.{type(layer).__qualname__}", layer.trainable,
              _renamed(_config(layer), position)] for layer in layers]
    tensors = [[list(map(int, v.shape)), str(v.dtype)] for v in model.trainable_weights]
    text = json.dumps([parts, tensors], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def key(model, **what):
    """The key of `model`'s table with `what` (input size, batch size, ...: JSON-able) on this
    TensorFlow, Keras and these devices."""
    flavor = flavors.for_model(model)
    devices = sorted(d.name for d in tf.config.list_logical_devices())
    return json.dumps({"model": model_fingerprint(model), "what": _plain(what),
                       "tensorflow": tf.__version__, "keras": [flavor.NAME,
                                                             flavor.keras.__version__],
                       "devices": devices}, sort_keys=True, default=str)


def put(table_key, table):
    """Keep a copy of `table` under `table_key`."""
    _TABLES[table_key] = copy.deepcopy(table)


def get(table_key, model, model_name=None):
    """A copy of the table kept under `table_key`, or None; its tensors named as `model`'s
    (the key holds their shapes, in order; Keras may have named them otherwise)."""
    if table_key not in _TABLES:
        return None
    table = copy.deepcopy(_TABLES[table_key])
    for t, v in zip(table["tensors"], model.trainable_weights):
        t["name"] = flavors.tensor_name(v)
    if model_name is not None:
        table["model"] = str(model_name)
    return table


def forget():
    """Drop every kept table (a benchmark that charges each run its own profiling)."""
    _TABLES.clear()


def _config(layer):
    try:
        return layer.get_config()
    except Exception:  # noqa: BLE001  (a subclassed layer or model without a config)
        return None


def _renamed(value, position):
    """`value` with every string that names one of the model's layers replaced by its
    position (configurations refer to layers by name: a functional model's inbound nodes)."""
    if isinstance(value, str):
        return position.get(value, value)
    if isinstance(value, dict):
        return {k: _renamed(v, position) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_renamed(v, position) for v in value]
    return value


def _plain(value):
    return json.loads(json.dumps(value, sort_keys=True, default=str))
