"""BatchNorm in inference mode (--bn_mode inference, --bn_mode frozen): putting a model's
BatchNorm layers in it, taking them out again, and telling whether a layer runs so
(prefix/graph.py).

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
traces anything.

--bn_mode frozen holds only the BatchNorm layers below the deepest tensor a step trains (eq. 3's
frozen prefix, where no gradient flows), as Keras runs a layer whose weights are frozen by hand;
those above it run as the model calls them (batch statistics in a training step).  A frozen
prefix then computes the pretrained features the head is evaluated on, not features of each
small batch's own statistics (which a batch of 8 estimates poorly, and which the moving
statistics, updated meanwhile, differ from at evaluation), and the prefix cache may cut above
its BatchNorm layers.  The trainers hold each selection's layers (FrozenHold) before its step
is traced, and none for the steps that compute every gradient.  Imports no Keras:
config/settings.py takes MODES from here.
"""
import contextlib
import weakref

from elastictrainer.errors import UserError

MODEL, INFERENCE, FROZEN = "model", "inference", "frozen"
MODES = (MODEL, INFERENCE, FROZEN)
HELP = {MODEL: "BatchNorm runs as the model calls it (batch statistics in a training step "
               "unless the model calls it with training=False)",
        INFERENCE: "every BatchNorm layer normalises with its moving statistics and leaves them "
                   "unchanged in every step, probe and evaluation; its gamma and beta still "
                   "train when selected",
        FROZEN: "a BatchNorm layer below the deepest tensor a step trains normalises with its "
                "moving statistics and leaves them unchanged, as Keras runs a frozen layer; "
                "the others run as the model calls them (full training: as model)"}

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
    inference mode (for restore), [] for MODEL, FROZEN or when there is none."""
    check(mode)
    if mode in (MODEL, FROZEN):  # FROZEN: held per selection (FrozenHold)
        return []
    return apply_layers(batch_norm_layers(model))


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
    """One line saying what apply did to `model` (FrozenHold will do, for FROZEN), or None for
    MODEL."""
    if mode == MODEL:
        return None
    total = len(batch_norm_layers(model))
    if not total:
        return f"--bn_mode {mode}: {model.name} has no BatchNorm layer"
    if mode == FROZEN:
        return (f"--bn_mode frozen: of the {total} BatchNorm layers of {model.name}, those "
                f"below the deepest tensor a step trains normalise with their moving statistics")
    many = total > 1
    return (f"--bn_mode {mode}: {total} BatchNorm layer{'s' if many else ''} of {model.name} "
            f"normalise{'' if many else 's'} with {'their' if many else 'its'} moving "
            f"statistics, which stay unchanged")


class FrozenHold:
    """--bn_mode frozen for a trainer: hold(selection) puts in inference mode exactly the
    BatchNorm layers of `model` whose tensors all lie below the selection's deepest one (their
    indices in `variables`, the trainer's list, are smaller than every selected index), and
    takes the others out of it; hold(None) takes them all out (the steps that compute every
    gradient).  A step is traced at its first call, so a trainer holds a selection's layers
    before it calls that selection's step; a held set equal to the last one costs nothing.
    A BatchNorm layer without trainable tensors is never held."""

    def __init__(self, model, variables):
        index = {id(v): k for k, v in enumerate(variables)}
        self._layers = []  # (the layer's last tensor index, layer)
        for layer in batch_norm_layers(model):
            own = [index[id(w)] for w in layer.trainable_weights if id(w) in index]
            if own:
                self._layers.append((max(own), layer))
        self._held = ()

    def layers_for(self, selection):
        """The layers hold(selection) puts in inference mode."""
        if not selection:
            return ()
        deepest = min(selection)
        return tuple(layer for last, layer in self._layers if last < deepest)

    def hold(self, selection):
        want = self.layers_for(selection)
        if want == self._held:
            return
        self.release()
        self._held = tuple(apply_layers(want))

    def release(self):
        """Every held layer runs as its model calls it again (a run's end)."""
        restore(self._held)
        self._held = ()

    @property
    def held(self):
        return self._held


def apply_layers(layers):
    """Force `layers` (BatchNorm layers) into inference mode; returns those this call forced."""
    from elastictrainer.flavors import compat

    forced = []
    for layer in layers:
        if layer not in _FORCED and compat.force_call_argument(layer, "training", False):
            _FORCED.add(layer)
            forced.append(layer)
    return forced
