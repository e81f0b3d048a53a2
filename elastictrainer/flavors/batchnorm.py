"""BatchNorm in inference mode (--bn_mode inference): putting a model's BatchNorm layers in it,
taking them out again, and telling whether a layer runs so (prefix/graph.py).

In inference mode every BatchNorm layer of the model, nested models' included, normalises with
its moving statistics and leaves them unchanged, whatever mode the model is called in: in every
training step, probe and evaluation.  Its gamma and beta stay trainable tensors like any other
(`trainable` is never touched: selection is by var_list, and the optimizer was built for
`trainable_weights`).  Keras' own practice when fine-tuning a pretrained model; here it also
makes a BatchNorm layer's output for one example independent of the rest of its batch, so the
prefix cache may cut above it.

Each layer's calls are forced to training=False (compat.force_call_argument), which reaches
every call of the layer object whichever Keras and however deep it is nested.  Functions
traced while a layer is forced keep it forced; a run puts its model in the mode before it
traces anything.  Imports no Keras: config/settings.py takes MODES from here.
"""
import contextlib
import weakref

from elastictrainer.errors import UserError

MODEL, INFERENCE = "model", "inference"
MODES = (MODEL, INFERENCE)
HELP = {MODEL: "BatchNorm runs as the model calls it (batch statistics in a training step "
               "unless the model calls it with training=False)",
        INFERENCE: "every BatchNorm layer normalises with its moving statistics and leaves them "
                   "unchanged in every step, probe and evaluation; its gamma and beta still "
                   "train when selected"}

# the layers forced to inference mode now (weak: a model dropped takes its layers with it)
_FORCED = weakref.WeakSet()


def check(mode):
    """UserError in one line unless `mode` is one of MODES."""
    if mode not in MODES:
        raise UserError(f"unknown --bn_mode {mode!r}; valid: {', '.join(MODES)}")


def batch_norm_layers(model):
    """Every BatchNorm layer of `model` (either Keras), nested models' included, once each."""
    from elastictrainer import flavors

    flavor = flavors.for_model(model)
    types = batch_norm_types(flavor)
    found, seen = [], set()
    for layer in flavor.layers(model):
        if isinstance(layer, types) and id(layer) not in seen:
            seen.add(id(layer))
            found.append(layer)
    return found


def batch_norm_types(flavor):
    """The BatchNorm layer classes of a flavor's Keras (its SyncBatchNormalization too)."""
    layers = flavor.keras.layers
    return (layers.BatchNormalization,) + tuple(
        t for t in [getattr(getattr(layers, "experimental", None), "SyncBatchNormalization",
                            None)] if t is not None)


def apply(model, mode):
    """Put `model`'s BatchNorm layers in `mode`; returns the layers this call forced into
    inference mode (for restore), [] for MODEL or when there is none."""
    from elastictrainer.flavors import compat

    check(mode)
    if mode == MODEL:
        return []
    forced = []
    for layer in batch_norm_layers(model):
        if layer not in _FORCED and compat.force_call_argument(layer, "training", False):
            _FORCED.add(layer)
            forced.append(layer)
    return forced


def restore(layers):
    """Undo apply: `layers` (what it returned) run as their model calls them again."""
    from elastictrainer.flavors import compat

    for layer in layers:
        compat.release_call_argument(layer)
        _FORCED.discard(layer)


@contextlib.contextmanager
def mode(model, bn_mode):
    """`model`'s BatchNorm layers in `bn_mode` for the block (apply, then restore)."""
    forced = apply(model, bn_mode)
    try:
        yield forced
    finally:
        restore(forced)


def in_inference(layer):
    """Whether `layer` is forced to inference mode (apply) now."""
    return layer in _FORCED


def forced_layers(model):
    """The BatchNorm layers of `model` in inference mode now (apply)."""
    return [layer for layer in batch_norm_layers(model) if in_inference(layer)]


def describe(model, mode):
    """One line saying what apply did to `model`, or None for MODEL."""
    if mode == MODEL:
        return None
    total = len(batch_norm_layers(model))
    if not total:
        return f"--bn_mode {mode}: {model.name} has no BatchNorm layer"
    many = total > 1
    return (f"--bn_mode {mode}: {total} BatchNorm layer{'s' if many else ''} of {model.name} "
            f"normalise{'' if many else 's'} with {'their' if many else 'its'} moving "
            f"statistics, which stay unchanged")
