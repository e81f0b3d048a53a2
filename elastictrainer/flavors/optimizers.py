"""The optimizers and learning-rate schedules a run can name, and which schedule each trains with.

Plain Python, imported by config (the flags' choices) and by the Keras flavors (building them),
so neither depends on the other.

The functions below dispatch to the optimizer's Keras (flavors/).  Adam's bias correction is counted per tensor: Keras corrects every tensor's moments with the
optimizer's global iteration count, which is right when every tensor trains at every step, but
elastic training (paper Sec. 4) trains a subset that changes every few epochs.  A tensor whose
moments are still zero at global step t would take a first step of
(1-beta1) sqrt(1-beta2^t) / ((1-beta1^t) sqrt(1-beta2)) x lr per element instead of lr: 1.5 x lr
at t = 256 (as measured by scripts/bench_importance.py), 2.5 at 1000, 3.2 in the limit, and up
to 6.5 x lr over its next steps.  Counting the steps each tensor has really taken gives it the
steps Adam intends, and is plain Adam for a tensor trained from step one
(tests/integration/test_importance.py).
"""
from elastictrainer import flavors
from elastictrainer.errors import UserError

# --optimizer choices (make_optimizer below builds them).
OPTIMIZERS = {
    "sgd": "SGD, momentum 0.9, decoupled weight decay lr_t x --weight_decay, cosine schedule "
           "(the reference's SGDW)",
    "adam": "plain Adam (advised for vit)",
}
# --lr_schedule choices; None (the default) is each optimizer's own, the reference's: cosine
# for sgd, constant for adam.
LR_SCHEDULES = {
    "cosine": "one cosine decay from --learning_rate to 0 over all training steps",
    "constant": "--learning_rate throughout",
}
DEFAULT_LR_SCHEDULE = {"sgd": "cosine", "adam": "constant"}


def lr_schedule_for(optimizer, schedule=None):
    """The LR_SCHEDULES name `optimizer` trains with: `schedule`, or the optimizer's own for None.
    An unknown optimizer or schedule is a UserError naming the valid ones."""
    if optimizer not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    schedule = schedule or DEFAULT_LR_SCHEDULE[optimizer]
    if schedule not in LR_SCHEDULES:
        raise UserError(f"unknown --lr_schedule {schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    return schedule


# ---------------------------------------------------------------- the optimizer, per Keras
def make_optimizer(name, learning_rate, weight_decay, total_steps,
                   per_tensor_bias_correction=True, schedule=None, flavor="tf_keras"):
    """sgd: momentum 0.9 with decoupled weight decay applied as lr_t x weight_decay.  adam: Adam,
    its bias correction counted per tensor (module docstring) unless
    per_tensor_bias_correction=False.  `schedule` (optim.LR_SCHEDULES; None: the optimizer's
    own, as the reference) is lr_t: for sgd one cosine decay over all steps, the reference's
    SGDW schedule exactly; for adam constant.  flavor: the Keras of the model it trains
    (flavors.FLAVORS)."""
    return flavors.get(flavor).make_optimizer(name, learning_rate, weight_decay, total_steps,
                                               per_tensor_bias_correction, schedule)


def check_optimizer(optimizer):
    """Refuse, with one line, an optimizer that apply_updates cannot apply as Keras would."""
    flavors.for_optimizer(optimizer).check_optimizer(optimizer)


def prepare_optimizer(optimizer, variables):
    """Check `optimizer`, build it once for every trainable tensor (optimizers refuse variables
    they were not built with), and create its learning-rate state outside any tf.function.  For
    Adam, also one step counter per tensor (module docstring) unless the optimizer's attribute
    `per_tensor_bias_correction` is False (Keras' global count)."""
    return flavors.for_optimizer(optimizer).prepare_optimizer(optimizer, list(variables))


def apply_updates(optimizer, grads, variables):
    """What `optimizer.apply_gradients` does, on one device, without tf.distribute's merge_call:
    that path keeps every graph it was traced in alive, one per tensor selection here (RSS grew
    14.4 MB per selection with tf-keras, MobileNetV2 at 64 px, against 0.5 MB on this path).
    The flavor's parts (flavors/), in Keras' order: this iteration's learning rate, the
    gradients that exist (clipped, sparse ones de-duplicated), each variable's decoupled weight
    decay and update rule, the iteration count and the constraints.  train/distributed_steps.py runs the
    same parts with update_variable on every replica's copy."""
    import tensorflow as tf

    flavor = flavors.for_optimizer(optimizer)
    with tf.name_scope(optimizer.name or "optimizer"):  # traces read 'SGD/...' as Keras' do
        flavor.begin_update(optimizer)
        grads, variables = flavor.prepare_gradients(optimizer, grads, variables)
        for g, v in zip(grads, variables):
            flavor.update_variable(optimizer, g, v)
        return flavor.finish_update(optimizer, variables)


def tensor_steps(optimizer, variable):
    """How many updates `variable` has received (Adam with per-tensor bias correction), else
    None."""
    return flavors.for_optimizer(optimizer).tensor_steps(optimizer, variable)


def fresh_step_supported(optimizer, variables):
    """Whether `fresh_step` covers this optimizer and these variables exactly."""
    return flavors.for_optimizer(optimizer).fresh_step_supported(optimizer, variables)


def fresh_step(optimizer, grads, variables):
    """The step dw0 a zeroed optimizer state would take on each of `variables`, in closed form,
    touching no variable (importance.taylor's dw0)."""
    return flavors.for_optimizer(optimizer).fresh_step(optimizer, grads, variables)


def tf_variable(v):
    """The tf.Variable behind a model variable (a Keras 3 variable wraps one)."""
    import tensorflow as tf

    value = getattr(v, "value", None)
    return value if isinstance(value, tf.Variable) else v


def snapshot(variables):
    """A function that puts `variables` (model or tf variables) back to their values as they are
    now: what a measurement that moves weights, optimizer slots or BatchNorm statistics undoes
    (the pace check's arms, the trial step's passes)."""
    import tensorflow as tf

    handles = [tf_variable(v) for v in variables]
    values = [tf.identity(h) for h in handles]

    def put_back():
        for handle, value in zip(handles, values):
            handle.assign(value)
    return put_back
