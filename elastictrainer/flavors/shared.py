"""What the two Kerases do alike, written once: each flavor module binds these to its own
`keras` (the layer API and the optimizer's bookkeeping are the same in tf-keras and Keras 3)."""
import contextlib
import functools

from elastictrainer.flavors import compat
from elastictrainer.errors import UserError
from elastictrainer.flavors.optimizers import lr_schedule_for


@contextlib.contextmanager
def inference_calls(layers):
    """Within it, every call of `layers` runs in inference mode (compat.force_call_argument),
    whatever its caller passes; functions traced within keep that.  For random layers (dropout,
    noise, augmentation): two forward passes compared within it see the same network, so their
    difference is the weights' doing, not two draws of a dropout mask."""
    forced = [layer for layer in layers if compat.force_call_argument(layer, "training", False)]
    try:
        yield
    finally:
        for layer in forced:
            compat.release_call_argument(layer)


def make_optimizer(keras, name, learning_rate, weight_decay, total_steps,
                   per_tensor_bias_correction=True, schedule=None):
    """optimizers.make_optimizer's optimizers, in `keras`."""
    lr = learning_rate
    if lr_schedule_for(name, schedule) == "cosine":
        lr = keras.optimizers.schedules.CosineDecay(learning_rate, max(int(total_steps), 1))
    if name == "adam":
        optimizer = keras.optimizers.Adam(lr)
        optimizer.per_tensor_bias_correction = per_tensor_bias_correction
        return optimizer
    return keras.optimizers.SGD(lr, momentum=0.9, weight_decay=weight_decay or None)


def release(keras):
    """(major, minor) of a Keras module."""
    return tuple(int(p) for p in keras.__version__.split(".")[:2])


def check_version(keras, tested, label, package):
    """Refuse, in one line, a `keras` outside the (lowest, highest) releases `tested`: its
    optimizer internals (compat/optimizers.py) may differ."""
    version = release(keras)
    if not tested[0] <= version <= tested[1]:
        lo, hi = (".".join(map(str, v)) for v in tested)
        raise UserError(f"{label} {keras.__version__} is outside the range this project was "
                        f"tested with ({lo} to {hi}); its optimizer internals may differ: "
                        f"install {package} {lo}.* to {hi}.*")


def made_by(tensor):
    """(layer, node_index) of the call that made a functional model's tensor, or None."""
    history = compat.keras_history(tensor)
    return None if history is None else (history[0], history[1])


def norm_layer_types(keras):
    return (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
            keras.layers.GroupNormalization)


def dense_type(keras):
    return keras.layers.Dense


def functional_model(keras, inputs, outputs, name):
    return keras.Model(inputs, outputs, name=name)


def set_random_seed(keras, seed):
    keras.utils.set_random_seed(seed)


def load_model(keras, path):
    return keras.models.load_model(path, compile=False)


def finish_update(optimizer, variables):
    """The iteration count, then the variables' constraints (both Kerases' order)."""
    if not variables:
        return optimizer.iterations
    iteration = optimizer.iterations.assign_add(1)
    for v in variables:
        if v.constraint is not None:
            v.assign(v.constraint(v))
    return iteration


def first_step(grads, variables, coefficients, use_weight_decay):
    """fresh_step's closed form per tensor, from the flavor's per-dtype coefficients
    (scale, root, eps, decay): SGD's -scale g (root None), Adam's first step
    -scale g / (root |g| + eps); then decoupled weight decay, -decay w."""
    import tensorflow as tf

    out = []
    for g, v in zip(grads, variables):
        scale, root, eps, decay = coefficients(v.dtype)
        dw = -scale * g if root is None else -(scale * g) / (root * tf.abs(g) + eps)
        if decay is not None and use_weight_decay(v):
            dw = dw - tf.convert_to_tensor(v) * decay
        out.append(dw)
    return out


def graph_input(keras, shape, dtype, name):
    """A new symbolic input of a functional model (per-example `shape`)."""
    return keras.Input(shape=tuple(shape), dtype=dtype, name=name)


def is_functional(keras, obj):
    """Whether `obj` is a functional model of `keras` (a graph of layer calls between
    symbolic inputs and outputs); a subclassed model has no outputs to walk back from."""
    return isinstance(obj, keras.Model) and bool(getattr(obj, "outputs", None))


def graph_calls(model, node_call):
    """(layer, call_args, call_kwargs, input_tensors, output_tensors) of every layer call of a
    functional model's own graph (a nested model's call is one of them), inputs first, input
    layers left out: a depth-first search back from its outputs, `node_call(tensor)` giving
    the call that made a tensor (compat's tf_keras_node_call, keras3_node_call)."""
    order, seen = [], set()
    inputs = {id(t) for t in model.inputs}

    def visit(tensor):
        if id(tensor) in inputs:
            return
        layer, node, args, kwargs, ins, outs, is_input = node_call(tensor)
        if id(node) in seen:
            return
        seen.add(id(node))
        for t in ins:
            visit(t)
        if not is_input:
            order.append((layer, args, kwargs, ins, outs))

    for t in model.outputs:
        visit(t)
    return order


def bound(keras):
    """norm_layer_types, dense_type, functional_model, set_random_seed, load_model,
    make_optimizer, graph_input and is_functional, bound to `keras`."""
    return tuple(functools.partial(f, keras) for f in (
        norm_layer_types, dense_type, functional_model, set_random_seed, load_model,
        make_optimizer, graph_input, is_functional))
