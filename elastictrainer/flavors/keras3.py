"""Keras 3 (`import keras` on TensorFlow >= 2.16, TensorFlow backend): its optimizers' update
without the distribution machinery, per-tensor Adam bias correction, the closed-form fresh step,
and what the rest of the package needs to know about its models (their functional graph
included, which the prefix cache flattens).  Private Keras 3 API through flavors/compat/.

A Keras 3 optimizer is built once for every trainable variable and then applies gradients to
any subset of them (it refuses a variable it was not built with: "Unknown variable").  Its own
`apply` runs the update inside tf.distribute's merge_call, which keeps every graph it was traced
in alive: a fresh train step per selection grew RSS by 1.5 MB per trace on a 8-tensor CNN (Adam),
against nothing through optimizers.apply_updates with the parts here, which run the same steps in the same order
(clipping, decoupled weight decay, the optimizer's public `update_step`, the iteration count,
constraints) on one device.
"""
import keras
import tensorflow as tf

from elastictrainer.flavors import compat
from elastictrainer.errors import UserError
from elastictrainer.flavors import shared

NAME = "keras3"
# Keras 3 releases whose optimizer internals (compat/optimizers.py's Keras 3 part) were tested:
# the one requirements-tf216.txt installs beside TensorFlow 2.16, and the one TensorFlow 2.21
# takes.
TESTED_KERAS = ((3, 3), (3, 15))


def is_model(obj):
    return isinstance(obj, keras.Model)


def is_optimizer(obj):
    return isinstance(obj, keras.optimizers.Optimizer)


# ---------------------------------------------------------------------------- optimizers
def check_optimizer(optimizer):
    """Refuse, with one line, what apply_updates does not do as Keras would."""
    shared.check_version(keras, TESTED_KERAS, "Keras", "keras")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise UserError("LossScaleOptimizer (mixed precision) is not supported")
    if getattr(optimizer, "use_ema", False):
        raise UserError("optimizers with use_ema=True are not supported: elastic training "
                        "updates a different subset of weights at each selection, so a moving "
                        "average over all of them would mix trained and frozen weights")
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise UserError("optimizers with gradient_accumulation_steps are not supported")
    missing = compat.keras3_missing_optimizer_api(optimizer)
    if missing:
        raise UserError(f"optimizer {type(optimizer).__name__} lacks {', '.join(missing)}")


def prepare_optimizer(optimizer, variables):
    """check_optimizer; build it for `variables` (a built optimizer must know them all); and
    one step counter per tensor for plain Adam or AdamW (flavors/optimizers.py's module docstring), unless the
    optimizer's attribute `per_tensor_bias_correction` is False."""
    check_optimizer(optimizer)
    if not optimizer.built:
        optimizer.build(variables)
    unknown = [v.path for v in variables if not compat.keras3_knows(optimizer, v)]
    if unknown:
        raise UserError(f"the optimizer was built for other variables than the model's "
                        f"trainable ones ({', '.join(unknown[:3])} ...): build it with "
                        f"model.trainable_variables")
    if getattr(optimizer, "per_tensor_bias_correction", True) and _is_plain_adam(optimizer):
        # `_tensor_steps` is this project's own attribute (variable key -> step count), kept out
        # of Keras' tracking: the counters are optimizer variables already, saved with it.
        counts = optimizer.__dict__.get("_tensor_steps")
        if counts is None:
            counts = optimizer.__dict__["_tensor_steps"] = {}
        for v in variables:
            key = compat.keras3_var_key(optimizer, v)
            if key not in counts:
                counts[key] = optimizer.add_variable(
                    shape=(), initializer="zeros", dtype=v.dtype,
                    name=v.path.replace("/", "_") + "_tensor_steps")
    return optimizer


def tensor_steps(optimizer, variable):
    counts = optimizer.__dict__.get("_tensor_steps")
    if counts is None:
        return None
    return int(counts[compat.keras3_var_key(optimizer, variable)].numpy())


def _is_plain_adam(optimizer):
    # Adam's own update rule (AdamW shares it; Adamax, Nadam and others do not).
    return type(optimizer).update_step is keras.optimizers.Adam.update_step


def _adam_update(optimizer, gradient, variable, learning_rate, count):
    """Keras 3's Adam.update_step with the bias correction of `variable`'s own step count."""
    dtype = variable.dtype
    lr = tf.cast(learning_rate, dtype)
    gradient = tf.cast(gradient, dtype)
    local_step = tf.cast(count, dtype) + 1
    beta_1_power = tf.pow(tf.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = tf.pow(tf.cast(optimizer.beta_2, dtype), local_step)
    m, v, v_hat = compat.keras3_adam_slots(optimizer, variable)
    alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    optimizer.assign_add(m, (gradient - m) * (1 - optimizer.beta_1))
    optimizer.assign_add(v, (tf.square(gradient) - v) * (1 - optimizer.beta_2))
    if v_hat is not None:  # amsgrad
        optimizer.assign(v_hat, tf.maximum(v_hat, v))
        v = v_hat
    optimizer.assign_sub(variable, (m * alpha) / (tf.sqrt(v) + optimizer.epsilon))
    count.assign_add(tf.ones((), count.dtype))


def begin_update(optimizer):
    """Nothing to set: Keras 3 reads the schedule's learning rate where it is used."""
    return None  # a body: AutoGraph cannot convert a function that is a docstring alone


def prepare_gradients(optimizer, grads, variables):
    """The gradients that exist, clipped, with their variables."""
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    if not pairs:
        return [], []
    grads = compat.keras3_clip_gradients(optimizer, [g for g, _ in pairs])
    return grads, [v for _, v in pairs]


def update_variable(optimizer, g, v):
    """Decoupled weight decay, then the update rule, on one variable (or one replica's copy of
    it, inside tf.distribute's update)."""
    learning_rate = optimizer.learning_rate
    if optimizer.weight_decay is not None and compat.keras3_use_weight_decay(optimizer, v):
        lr = tf.cast(learning_rate, v.dtype)
        v.assign(v - v * tf.cast(optimizer.weight_decay, v.dtype) * lr)
    counts = optimizer.__dict__.get("_tensor_steps")
    if counts is not None:
        _adam_update(optimizer, g, v, learning_rate, counts[compat.keras3_var_key(optimizer, v)])
    else:
        optimizer.update_step(g, v, learning_rate)




def fresh_step_supported(optimizer, variables):
    """Whether fresh_step covers this optimizer exactly: SGD, or Adam/AdamW (any bias
    correction: a fresh state's first step is the same), no clipping, no constraints."""
    if any(getattr(optimizer, a, None) for a in ("clipnorm", "global_clipnorm", "clipvalue")):
        return False
    if any(getattr(v, "constraint", None) is not None for v in variables):
        return False
    return (type(optimizer).update_step is keras.optimizers.SGD.update_step
            or _is_plain_adam(optimizer))


def fresh_step(optimizer, grads, variables):
    """tf_keras.fresh_step's closed form for Keras 3's SGD and Adam (whose epsilon is added to
    sqrt(v) as given): decoupled weight decay -lr wd w, then SGD's first momentum step -lr g
    (nesterov: -lr (1 + momentum) g) or Adam's bias-corrected first step
    -lr sqrt(1 - b2) g / (sqrt(1 - b2) |g| + eps)."""
    adam = _is_plain_adam(optimizer)
    nesterov = bool(getattr(optimizer, "momentum", 0) and getattr(optimizer, "nesterov", False))
    learning_rate = optimizer.learning_rate
    scalars = {}

    def coefficients(dtype):
        if dtype not in scalars:
            lr = tf.cast(learning_rate, dtype)
            decay = (None if optimizer.weight_decay is None
                     else tf.cast(optimizer.weight_decay, dtype) * lr)
            if adam:
                root = tf.sqrt(1 - tf.cast(optimizer.beta_2, dtype))
                scalars[dtype] = (lr * root, root, tf.cast(optimizer.epsilon, dtype), decay)
            else:
                scalars[dtype] = (lr * (1 + tf.cast(optimizer.momentum, dtype)) if nesterov
                                  else lr, None, None, decay)
        return scalars[dtype]

    return shared.first_step(grads, variables, coefficients,
                             lambda v: compat.keras3_use_weight_decay(optimizer, v))


# ---------------------------------------------------------------------------- models
def variable_name(variable):
    """The name a timing table and summary.json give a trainable tensor: its path (a Keras 3
    variable's name is its last part only, 'kernel')."""
    return variable.path


def layers(model):
    """Every layer of `model`, nested ones included, the model first."""
    return [model] + [layer for layer in compat.keras3_flatten_layers(model)
                      if layer is not model]


def own_trainable_weights(layer):
    return compat.keras3_own_trainable_variables(layer)










def random_layers(model):
    """The layers of `model` that draw random numbers in training mode (dropout, noise,
    augmentation): those holding a keras.random.SeedGenerator."""
    return [layer for layer in layers(model)[1:] if any(
        isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values())]


def random_state_variables(model):
    """The state variables of the layers' seed generators (augmentation, dropout), which a
    checkpoint saves and profiling inside a run must not advance.  Keras 3 layers keep a
    keras.random.SeedGenerator under an attribute of their own choosing (`seed_generator`,
    `generator`): every one a layer holds counts."""
    states = []
    for layer in layers(model):
        for value in vars(layer).values():
            if isinstance(value, keras.random.SeedGenerator) and all(
                    value.state is not s for s in states):
                states.append(value.state)
    return states






# ---------------------------------------------------------------------------- model.fit
def fit_forward(model, data, call=None):
    """What the model's own train_step computes before its gradients: (x, y, sample_weight,
    y_pred, loss), with `call` (default: the model) mapping x to y_pred,
    the "loss" metric updated."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = (call or model)(x, training=True)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
    compat.keras3_loss_tracker(model).update_state(
        compat.keras3_unscale_loss_for_replicas(loss),
        sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
    return x, y, sample_weight, y_pred, loss


def losses_scaled_for_replicas():
    """Whether a replica's compiled loss comes divided by the replicas in sync."""
    return compat.keras3_scales_loss_for_replicas()


def fit_metrics(model, x, y, y_pred, sample_weight):
    """The logs the model's own train_step returns."""
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def fit_loss_fn(model):
    """loss_fn(y, y_pred) of the compiled model, for the profiler."""
    return lambda y, y_pred: model.compute_loss(y=y, y_pred=y_pred)


def steps_per_execution(model):
    return int(getattr(model, "steps_per_execution", 1) or 1)




# ---------------------------------------------------------------------------- functional graph
def graph_calls(model):
    """shared.graph_calls of a functional model of this Keras."""
    return shared.graph_calls(model, compat.keras3_node_call)


def call_mode(call_kwargs, enclosing):
    """The training mode a layer call of a functional graph runs in, given the call's own
    arguments and the mode of the call enclosing it (None: the step's): Keras 3's functional
    call hands the mode it was called in to every call of its graph over what the graph
    passes, so a backbone called with training=False runs in the step's mode when the step
    says training=True (as every step here does; checked by the tests on Keras 3.3 and 3.15)."""
    return enclosing


# the same in both Kerases (shared.py), bound to this one
made_by, finish_update = shared.made_by, shared.finish_update
(norm_layer_types, dense_type, functional_model, set_random_seed, load_model,
 make_optimizer, graph_input, is_functional) = shared.bound(keras)
