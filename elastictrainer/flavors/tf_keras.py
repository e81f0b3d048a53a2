"""tf-keras (Keras 2 API, `import tf_keras as keras`): its optimizers' update without the
distribution machinery, per-tensor Adam bias correction, the closed-form fresh step, and what
the rest of the package needs to know about its models (their functional graph included,
which the prefix cache flattens).  Private tf-keras API through flavors/compat/."""
import tensorflow as tf
import tf_keras as keras

from elastictrainer.flavors import compat
from elastictrainer.errors import UserError
from elastictrainer.flavors import shared

NAME = "tf_keras"
# tf-keras releases whose optimizer internals `_apply` was tested against (.ci/run runs the tests
# on both ends).
TESTED_TF_KERAS = ((2, 16), (2, 21))


def check_optimizer(optimizer):
    """Refuse, with one line, an optimizer that apply_updates cannot apply as Keras would."""
    shared.check_version(keras, TESTED_TF_KERAS, "tf-keras", "tf-keras")
    missing = compat.missing_optimizer_api(optimizer)
    if missing:
        raise UserError(f"optimizer {type(optimizer).__name__} lacks {', '.join(missing)}: "
                        "only tf_keras.optimizers (not legacy or Keras 3 ones) are supported")
    if getattr(optimizer, "use_ema", False):
        raise UserError("optimizers with use_ema=True are not supported: elastic training "
                        "updates a different subset of weights at each selection, so a moving "
                        "average over all of them would mix trained and frozen weights")
    if compat.is_dtensor_optimizer(optimizer):
        raise UserError("DTensor optimizers are not supported")


def prepare_optimizer(optimizer, variables):
    """Check `optimizer`, build it once for every trainable tensor (new-style optimizers refuse
    variables they were not built with), and create its learning-rate state outside any
    tf.function.  For Adam, also one step counter per tensor (see the module docstring) unless
    the optimizer's attribute `per_tensor_bias_correction` is False (Keras' global count)."""
    check_optimizer(optimizer)
    variables = list(variables)
    optimizer.build(variables)
    compat.compute_current_learning_rate(optimizer)
    if (getattr(optimizer, "per_tensor_bias_correction", True) and _is_plain_adam(optimizer)
            and compat.has_adam_slots(optimizer)):
        # `_tensor_steps` is this project's own attribute (var_key -> step count), not Keras'.
        counts = getattr(optimizer, "_tensor_steps", None)
        if counts is None:
            # Past Keras' attribute tracking: a tracked dict would be a second checkpoint path
            # to these variables (they are saved as the optimizer's variables already), and
            # tf.train.Checkpoint refuses one filled after it was wrapped.
            counts = optimizer.__dict__["_tensor_steps"] = {}
        for v in variables:
            key = compat.var_key(optimizer, v)
            if key not in counts:
                # An optimizer variable (optimizer.variables), so it is saved, restored and reset
                # with the moments; float like Keras' own step arithmetic, exact to 2^24 steps.
                counts[key] = optimizer.add_variable_from_reference(
                    v, "tensor_steps", shape=(), initial_value=tf.zeros((), v.dtype))
    return optimizer


def tensor_steps(optimizer, variable):
    """How many updates `variable` has received (Adam with per-tensor bias correction), else
    None."""
    counts = getattr(optimizer, "_tensor_steps", None)
    if counts is None:
        return None
    return int(counts[compat.var_key(optimizer, variable)].numpy())


def _is_plain_adam(optimizer):
    # Adam's own update rule: Adam's, or AdamW's (the same rule without adaptive epsilon; its
    # decoupled weight decay is the base optimizer's), not one that changes it (Adamax, Nadam)
    return type(optimizer).update_step in (keras.optimizers.Adam.update_step,
                                           keras.optimizers.AdamW.update_step)


def _adam_update(optimizer, gradient, variable, count):
    """tf_keras' Adam.update_step with the bias correction of `variable`'s own step count."""
    lr = tf.cast(optimizer.learning_rate, variable.dtype)
    local_step = count + 1
    beta_1_power = tf.pow(tf.cast(optimizer.beta_1, variable.dtype), local_step)
    beta_2_power = tf.pow(tf.cast(optimizer.beta_2, variable.dtype), local_step)
    m, v, v_hat = compat.adam_slots(optimizer, variable)
    alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    epsilon_hat = optimizer.epsilon
    if getattr(optimizer, "adaptive_epsilon", False):  # tf-keras >= 2.17
        epsilon_hat = optimizer.epsilon * tf.sqrt(1 - beta_2_power)
    if isinstance(gradient, tf.IndexedSlices):
        m.assign_add(-m * (1 - optimizer.beta_1))
        m.scatter_add(tf.IndexedSlices(gradient.values * (1 - optimizer.beta_1),
                                       gradient.indices))
        v.assign_add(-v * (1 - optimizer.beta_2))
        v.scatter_add(tf.IndexedSlices(tf.square(gradient.values) * (1 - optimizer.beta_2),
                                       gradient.indices))
    else:
        m.assign_add((gradient - m) * (1 - optimizer.beta_1))
        v.assign_add((tf.square(gradient) - v) * (1 - optimizer.beta_2))
    if v_hat is not None:  # amsgrad
        v_hat.assign(tf.maximum(v_hat, v))
        v = v_hat
    variable.assign_sub((m * alpha) / (tf.sqrt(v) + epsilon_hat))
    count.assign_add(1)


def fresh_step_supported(optimizer, variables):
    """Whether `fresh_step` covers this optimizer and these variables exactly: tf-keras SGD, or
    Adam with per-tensor step counts (what make_optimizer builds), no gradient clipping, no
    variable constraints.  Anything else takes the probe's general path (importance.py)."""
    if any(getattr(optimizer, a, None) for a in ("clipnorm", "global_clipnorm", "clipvalue")):
        return False
    if any(getattr(v, "constraint", None) is not None for v in variables):
        return False
    if type(optimizer).update_step is keras.optimizers.SGD.update_step:
        return True
    return (_is_plain_adam(optimizer) and getattr(optimizer, "_tensor_steps", None) is not None
            and all(compat.var_key(optimizer, v) in optimizer._tensor_steps for v in variables))


def fresh_step(optimizer, grads, variables):
    """The step dw0 that `_apply` would take on each of `variables` from a zeroed optimizer state
    (momenta, Adam's moments and per-tensor step counts zero; iteration count and so the
    learning-rate schedule kept), in closed form, touching no variable: importance.taylor's
    dw0 without the snapshot, update and restore of every weight and slot that the general
    path needs (for ResNet50 with SGD, 200 MB held during the probe).  Dense gradients only;
    call where fresh_step_supported is true.  Tested against the general path
    (tests/integration/test_importance.py).

    From `_apply`'s order: decoupled weight decay first, -lr wd w, then the update rule on the
    gradient: SGD's first momentum step is -lr g (nesterov: -lr (1 + momentum) g); Adam's first
    step, bias-corrected with its own count 1, is -alpha m / (sqrt(v) + eps) with
    m = (1 - b1) g, v = (1 - b2) g^2, alpha = lr sqrt(1 - b2) / (1 - b1)."""
    compat.compute_current_learning_rate(optimizer)
    adam = _is_plain_adam(optimizer)
    nesterov = bool(getattr(optimizer, "momentum", 0) and optimizer.nesterov)
    scalars = {}  # per dtype, computed once: the graph stays a few ops per tensor (its compile)

    def coefficients(dtype):
        if dtype not in scalars:
            lr = tf.cast(optimizer.learning_rate, dtype)
            decay = (None if optimizer.weight_decay is None
                     else tf.cast(optimizer.weight_decay, dtype) * lr)
            if adam:
                root = tf.sqrt(1 - tf.cast(optimizer.beta_2, dtype))
                eps = tf.cast(optimizer.epsilon, dtype)
                if getattr(optimizer, "adaptive_epsilon", False):  # as _adam_update
                    eps = eps * root
                # sqrt(v) = sqrt(1 - b2) |g|, and alpha (1 - b1) = lr sqrt(1 - b2)
                scalars[dtype] = (lr * root, root, eps, decay)
            else:
                scalars[dtype] = (lr * (1 + tf.cast(optimizer.momentum, dtype)) if nesterov
                                  else lr, None, None, decay)
        return scalars[dtype]

    return shared.first_step(grads, variables, coefficients,
                             lambda v: compat.use_weight_decay(optimizer, v))


# The steps apply_gradients runs inside tf.distribute's merge_call (see apply_updates), all
# private tf-keras API (compat/optimizers.py).  Tested against tf-keras TESTED_TF_KERAS
# (tests/integration/test_engine.py compares with apply_gradients); check_optimizer refuses other
# versions.
def begin_update(optimizer):
    """The learning rate of this iteration (a variable the schedule is written to)."""
    compat.compute_current_learning_rate(optimizer)


def prepare_gradients(optimizer, grads, variables):
    """The gradients that exist, clipped and de-duplicated, with their variables."""
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    if not pairs:
        return [], []
    grads = compat.clip_gradients(optimizer, [g for g, _ in pairs])
    grads = compat.deduplicate_sparse_grad(optimizer, grads)
    return grads, [v for _, v in pairs]


def update_variable(optimizer, g, v):
    """Decoupled weight decay, then the update rule, on one variable (or one replica's copy of
    it, inside tf.distribute's update)."""
    if optimizer.weight_decay is not None and compat.use_weight_decay(optimizer, v):
        lr = tf.cast(optimizer.learning_rate, v.dtype)
        v.assign_sub(v * tf.cast(optimizer.weight_decay, v.dtype) * lr)
    counts = getattr(optimizer, "_tensor_steps", None)  # ours: prepare_optimizer
    if counts is not None:
        update = _adam_update
        if optimizer.jit_compile:
            update = optimizer.__dict__.setdefault(
                "_adam_update_xla", tf.function(_adam_update, jit_compile=True))
        update(optimizer, g, v, counts[compat.var_key(optimizer, v)])
    elif optimizer.jit_compile:
        compat.update_step_xla(optimizer, g, v)
    else:
        compat.update_step(optimizer, g, v)




def is_model(obj):
    return isinstance(obj, keras.Model)


def is_optimizer(obj):
    return isinstance(obj, keras.optimizers.Optimizer)


# ---------------------------------------------------------------------------- models
def variable_name(variable):
    """The name a timing table and summary.json give a trainable tensor."""
    return variable.name


def layers(model):
    """Every layer of `model`, nested ones included, the model first."""
    return [model] + [m for m in model.submodules if isinstance(m, keras.layers.Layer)]


def own_trainable_weights(layer):
    return compat.own_trainable_weights(layer)










def random_layers(model):
    """The layers of `model` that draw random numbers in training mode (dropout, noise,
    augmentation)."""
    return [layer for layer in layers(model)[1:] if compat.is_random_layer(layer)]


def random_state_variables(model):
    """The state variables of the random layers' generators (augmentation, dropout), which a
    checkpoint saves and profiling inside a run must not advance."""
    gens = [compat.layer_random_generator(layer) for layer in model.submodules]
    return [g.state for g in gens if g is not None]






# ---------------------------------------------------------------------------- model.fit
def fit_forward(model, data, call=None):
    """What the model's own train_step computes before its gradients: (x, y, sample_weight,
    y_pred, loss), with `call` (default: the model) mapping x to y_pred,
    the compiled loss (and its "loss" metric) updated."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = (call or model)(x, training=True)
    loss = model.compute_loss(x, y, y_pred, sample_weight)
    return x, y, sample_weight, y_pred, loss


def losses_scaled_for_replicas():
    """Whether a replica's compiled loss comes divided by the replicas in sync: tf-keras's
    compiled losses are, in a replica context."""
    return True


def fit_metrics(model, x, y, y_pred, sample_weight):
    """The logs the model's own train_step returns."""
    return model.compute_metrics(x, y, y_pred, sample_weight)


def fit_loss_fn(model):
    """loss_fn(y, y_pred) of the compiled model, for the profiler."""
    return lambda y, y_pred: model.compute_loss(None, y, y_pred, None)


def steps_per_execution(model):
    return compat.steps_per_execution(model)




# ---------------------------------------------------------------------------- functional graph
def graph_calls(model):
    """shared.graph_calls of a functional model of this Keras."""
    return shared.graph_calls(model, compat.tf_keras_node_call)


def call_mode(call_kwargs, enclosing):
    """The training mode a layer call of a functional graph runs in, given the call's own
    arguments and the mode of the call enclosing it (None: the step's): tf-keras keeps a
    `training` the graph passes (a backbone called with training=False stays in inference
    mode inside a training step)."""
    mode = call_kwargs.get("training")
    return enclosing if mode is None else bool(mode)


# the same in both Kerases (shared.py), bound to this one
made_by, finish_update = shared.made_by, shared.finish_update
(norm_layer_types, dense_type, functional_model, set_random_seed, load_model,
 make_optimizer, graph_input, is_functional) = shared.bound(keras)
