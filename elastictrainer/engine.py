"""The compiled training step shared by the profiler and the training loop, and the optimizers.

One definition of "a training step" keeps the profiled graph and the trained graph the same:
what the Tensor Timing Profiler measures is what training later runs.  Every use of tf-keras'
private optimizer API in the project is in `_apply` below.
"""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tensorflow as tf
import tf_keras as keras

from elastictrainer.common import UserError
from elastictrainer.config import OPTIMIZERS
# tf-keras releases whose optimizer internals `_apply` was tested against (.ci/run runs the tests
# on both ends).
TESTED_TF_KERAS = ((2, 16), (2, 21))
_PRIVATE_OPTIMIZER_API = ("_compute_current_learning_rate", "_clip_gradients",
                          "_deduplicate_sparse_grad", "_use_weight_decay", "_update_step",
                          "_update_step_xla", "_var_key")


def make_loss():
    """Sparse categorical cross-entropy on logits, as the reference."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_optimizer(name, learning_rate, weight_decay, total_steps):
    """sgd: momentum 0.9 with decoupled weight decay applied as lr_t x weight_decay, lr_t on one
    cosine decay over all steps: the reference's SGDW schedule exactly.  adam: plain Adam."""
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, max(int(total_steps), 1))
    return keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=weight_decay or None)


def make_train_step(model, optimizer, loss_fn, var_list, penalty_fn=None, capture=None):
    """A tf.function that trains only `var_list` on one batch.

    Gradients are asked for `var_list` alone, so TensorFlow prunes every backward op that no
    selected tensor needs: this pruning is where ElasticTrainer's speedup comes from.
    `capture`, if given, is a dict filled at trace time with the graph tensors `loss` and `grads`
    (in var_list order), so the profiler can analyse the dataflow of the traced graph.
    Returns (loss, logits).
    """
    var_list = list(var_list)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
            total = loss + penalty_fn() if penalty_fn is not None else loss
        grads = tape.gradient(total, var_list)
        if capture is not None:
            capture["loss"] = total
            capture["grads"] = list(grads)
        apply_updates(optimizer, grads, var_list)
        return loss, logits

    return train_step


def make_forward_step(model, loss_fn):
    """The forward pass of a training step (training-mode model call plus loss), compiled."""

    @tf.function
    def forward_step(x, y):
        logits = model(x, training=True)
        return loss_fn(y, logits), logits

    return forward_step


def check_optimizer(optimizer):
    """Refuse, with one line, an optimizer that apply_updates cannot apply as Keras would."""
    version = tuple(int(p) for p in keras.__version__.split(".")[:2])
    if not TESTED_TF_KERAS[0] <= version <= TESTED_TF_KERAS[1]:
        lo, hi = (".".join(map(str, v)) for v in TESTED_TF_KERAS)
        raise UserError(f"tf-keras {keras.__version__} is outside the range this project was "
                        f"tested with ({lo} to {hi}); its optimizer internals may differ: "
                        f"install tf-keras {lo}.* to {hi}.*")
    missing = [a for a in _PRIVATE_OPTIMIZER_API if not hasattr(optimizer, a)]
    if missing:
        raise UserError(f"optimizer {type(optimizer).__name__} lacks {', '.join(missing)}: "
                        "only tf_keras.optimizers (not legacy or Keras 3 ones) are supported")
    if getattr(optimizer, "use_ema", False):
        raise UserError("optimizers with use_ema=True are not supported: elastic training "
                        "updates a different subset of weights at each selection, so a moving "
                        "average over all of them would mix trained and frozen weights")
    if getattr(optimizer, "_mesh", None) or getattr(optimizer, "_run_with_dtensor", False):
        raise UserError("DTensor optimizers are not supported")


def prepare_optimizer(optimizer, variables):
    """Check `optimizer`, build it once for every trainable tensor (new-style optimizers refuse
    variables they were not built with), and create its learning-rate state outside any
    tf.function."""
    check_optimizer(optimizer)
    optimizer.build(list(variables))
    optimizer._compute_current_learning_rate()  # private API: see _apply
    return optimizer


def apply_updates(optimizer, grads, variables):
    """`optimizer.apply_gradients` on one device, without its tf.distribute merge_call.

    The merge_call path keeps every graph it was traced in alive: with a new train step traced
    per tensor selection, RSS grew 14.4 MB per selection (MobileNetV2 at 64 px, 30 distinct
    selections), against 0.5 MB on this path.  What Keras does that this path does too, in its
    order: learning rate of this iteration, gradient clipping, sparse-gradient de-duplication,
    decoupled weight decay, the update rule (XLA-compiled where Keras would), iteration count,
    variable constraints.  What it refuses is refused up front by check_optimizer.
    """
    with tf.name_scope(optimizer.name or "optimizer"):  # traces read 'SGD/...' as with keras
        return _apply(optimizer, grads, variables)


def _apply(optimizer, grads, variables):
    # Private tf-keras API, all of it here: apply_gradients' public path goes through
    # tf.distribute's merge_call (see apply_updates), and these are the steps it runs inside.
    # Tested against tf-keras TESTED_TF_KERAS (tests/test_engine.py compares with
    # apply_gradients); check_optimizer refuses other versions.
    optimizer._compute_current_learning_rate()
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    if not pairs:
        return optimizer.iterations
    grads = optimizer._clip_gradients([g for g, _ in pairs])
    grads = optimizer._deduplicate_sparse_grad(grads)
    variables = [v for _, v in pairs]
    if optimizer.weight_decay is not None:
        for v in variables:
            if optimizer._use_weight_decay(v):
                lr = tf.cast(optimizer.learning_rate, v.dtype)
                v.assign_sub(v * tf.cast(optimizer.weight_decay, v.dtype) * lr)
    for g, v in zip(grads, variables):
        if optimizer.jit_compile:
            optimizer._update_step_xla(g, v, id(optimizer._var_key(v)))
        else:
            optimizer._update_step(g, v)
    iteration = optimizer.iterations.assign_add(1)
    for v in variables:
        if v.constraint is not None:
            v.assign(v.constraint(v))
    return iteration
