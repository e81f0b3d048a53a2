"""The compiled training step shared by the profiler and the training loop, and the optimizers.

One definition of "a training step" keeps the profiled graph and the trained graph the same:
what the Tensor Timing Profiler measures is what training later runs.  The optimizer's update
runs through the model's Keras (flavors/: tf-keras or Keras 3, detected from the optimizer):
`apply_updates`, `fresh_step` and the per-tensor Adam bias correction live there, one module per
Keras, with their private API reached through compat.py.

Adam's bias correction is counted per tensor: Keras corrects every tensor's moments with the
optimizer's global iteration count, which is right when every tensor trains at every step, but
elastic training (paper Sec. 4) trains a subset that changes every few epochs.  A tensor whose
moments are still zero at global step t would take a first step of
(1-beta1) sqrt(1-beta2^t) / ((1-beta1^t) sqrt(1-beta2)) x lr per element instead of lr: 1.5 x lr
at t = 256 (as measured by scripts/bench_importance.py), 2.5 at 1000, 3.2 in the limit, and up
to 6.5 x lr over its next steps.  Counting the steps each tensor has really taken gives it the
steps Adam intends, and is plain Adam for a tensor trained from step one
(tests/integration/test_importance.py).
"""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tensorflow as tf
import tf_keras as keras

from elastictrainer import compat, flavors
from elastictrainer.flavors.tf_keras import TESTED_TF_KERAS  # noqa: F401  (tests, compat)


def make_loss():
    """Sparse categorical cross-entropy on logits, as the reference."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_train_step(model, optimizer, loss_fn, var_list, penalty_fn=None, capture=None):
    """A tf.function that trains only `var_list` on one batch.

    Gradients are asked for `var_list` alone, so TensorFlow prunes every backward op that no
    selected tensor needs: this pruning is where ElasticTrainer's speedup comes from.
    `capture`, if given, is a dict filled at trace time with the graph tensors `loss` and `grads`
    (in var_list order), so the profiler can analyse the dataflow of the traced graph.
    Returns (loss, logits).
    """
    var_list = list(var_list)
    apply = apply_updates

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
        apply(optimizer, grads, var_list)
        return loss, logits

    return train_step


class ProbeStep:
    """Every tensor's backward pass without the update: `probe(x, y, want_terms=False)` returns
    (loss, logits, terms), terms one float64 per tensor from the gradients (zeros when not wanted
    or terms_fn is None).  The elastic runtime's probe and timed full steps: they compute what a
    full step computes, so they time it and give the importance, but change no weight and no
    optimizer state.  An elastic run trains its selections only (a few full Adam steps at
    lr 1e-3 shook a pretrained MobileNetV2 from a training loss of 1.9 to 2.4); one that trains
    every tensor does so through make_train_step, full training's own step.

    Two compiled functions: the step returns the gradients, and the terms are a function of
    their own, run on them only when wanted.  Both choices keep the probe's peak memory under
    full training's step (MobileNetV2, 224 px, batch 4, SGD; resident MB after six calls, each
    variant in a fresh process): full training step 1029-1036, this step 992, the same step
    with an update branch behind a switch 1055-1058; the terms inside the step raised it too.
    The update branch also tripled its compile (Adam: 7.3 s against 1.3 s here, and 5.2 s for
    full training's step)."""

    def __init__(self, model, optimizer, loss_fn, var_list, terms_fn=None, penalty_fn=None):
        var_list = list(var_list)
        self.n = len(var_list)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
                total = loss + penalty_fn() if penalty_fn is not None else loss
            return loss, logits, tape.gradient(total, var_list)

        self.step = step
        self.terms = None if terms_fn is None else tf.function(terms_fn)

    def traced(self, want_terms=False):
        """Whether calling with `want_terms` compiles nothing new."""
        def has(fn):
            return bool(compat.concrete_functions(fn))

        return has(self.step) and (not want_terms or self.terms is None or has(self.terms))

    def __call__(self, x, y, want_terms=False):
        loss, logits, grads = self.step(x, y)
        if want_terms and self.terms is not None:
            terms = self.terms(grads)
        else:
            terms = tf.zeros([self.n], tf.float64)
        return loss, logits, terms


def make_probe_step(model, optimizer, loss_fn, var_list, terms_fn=None, penalty_fn=None):
    """The probe step of `var_list` (ProbeStep)."""
    return ProbeStep(model, optimizer, loss_fn, var_list, terms_fn, penalty_fn)


def make_gradient_step(model, loss_fn, var_list):
    """A full training step without the update, compiled: forward pass, loss, and the gradients
    of every tensor in `var_list` (returned, in var_list order).  It changes no weight and no
    optimizer state; a training-mode forward pass may still move a normalisation layer's
    moving statistics and random generators.  The out-of-step importance probes' gradients,
    and the profiler's t_grads_ms (what the optimizer's update adds to a step)."""
    var_list = list(var_list)

    @tf.function
    def gradient_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, var_list)

    return gradient_step


def first_output(outputs):
    """The first tensor a step returned (its loss, or its first gradient that is not None):
    fetching it waits for the step."""
    return next(t for t in tf.nest.flatten(outputs) if t is not None)


def make_forward_step(model, loss_fn):
    """The forward pass of a training step (training-mode model call plus loss), compiled."""

    @tf.function
    def forward_step(x, y):
        logits = model(x, training=True)
        return loss_fn(y, logits), logits

    return forward_step




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
    decay and update rule, the iteration count and the constraints.  distribute.py runs the
    same parts with update_variable on every replica's copy."""
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


# ---------------------------------------------------------------- steps under tf.distribute
def tf_variable(v):
    """The tf.Variable behind a model variable (a Keras 3 variable wraps one)."""
    value = getattr(v, "value", None)
    return value if isinstance(value, tf.Variable) else v


def _per_replica_loss(y, logits, global_batch):
    """This replica's share of the global batch's mean loss (all-reduced by SUM: the mean)."""
    per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    return tf.reduce_sum(per_example) / tf.cast(global_batch, per_example.dtype)


def _batch_stats(y, logits, loss):
    correct = tf.reduce_sum(tf.cast(tf.equal(
        tf.argmax(logits, -1, output_type=tf.int32), tf.cast(y, tf.int32)), tf.float64))
    return tf.stack([tf.cast(loss, tf.float64), correct, tf.cast(tf.shape(y)[0], tf.float64)])


class DistributedStep:
    """A train step (or, with `train` false, a probe step: every gradient, no update) under a
    tf.distribute strategy (distribute.py's module docstring).  `step(x, y)` on distributed
    batches returns (loss, stats[, grads]): the global batch's mean loss, and [loss, correct,
    examples] summed over the replicas.  `allreduce_bytes`: what one call all-reduces, known
    once traced."""

    def __init__(self, dist, model, optimizer, var_list, global_batch, penalty_fn=None,
                 train=True):
        strategy = dist.strategy
        var_list = list(var_list)
        flavor = flavors.for_optimizer(optimizer)
        replicas = strategy.num_replicas_in_sync
        self.allreduce_bytes = None

        def replica(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = _per_replica_loss(y, logits, global_batch)
                total = loss + penalty_fn() / replicas if penalty_fn is not None else loss
            grads = tape.gradient(total, var_list)
            present = [k for k, g in enumerate(grads) if g is not None]
            # what the all-reduce moves: the selected tensors' gradients, nothing else
            self.allreduce_bytes = sum(grads[k].shape.num_elements() * grads[k].dtype.size
                                       for k in present)
            reduced = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [grads[k] for k in present])
            for k, g in zip(present, reduced):
                grads[k] = g
            if train:
                grads, _ = flavor.prepare_gradients(optimizer, grads, var_list)
            return _batch_stats(y, logits, loss), grads

        @tf.function
        def step(x, y):
            if train:
                flavor.begin_update(optimizer)
            stats, grads = strategy.run(replica, args=(x, y))
            stats = strategy.reduce(tf.distribute.ReduceOp.SUM, stats, axis=None)
            if not train:
                return stats[0], stats, strategy.experimental_local_results(grads)[0]
            for g, v in zip(grads, var_list):
                strategy.extended.update(
                    tf_variable(v), lambda var, grad: flavor.update_variable(optimizer, grad, var),
                    args=(g,), group=False)
            flavor.finish_update(optimizer, var_list)
            return stats[0], stats

        self.step = step

    def __call__(self, x, y):
        return self.step(x, y)


class DistributedProbeStep(ProbeStep):
    """ProbeStep under a strategy: every gradient of the global batch, all-reduced, and the
    importance terms from them; no update.  (loss, stats, terms)."""

    def __init__(self, dist, model, optimizer, var_list, global_batch, terms_fn=None,
                 penalty_fn=None):
        self.n = len(var_list)
        self.inner = DistributedStep(dist, model, optimizer, var_list, global_batch,
                                     penalty_fn, train=False)
        self.step = self.inner.step
        self.terms = None if terms_fn is None else tf.function(terms_fn)

    @property
    def allreduce_bytes(self):
        return self.inner.allreduce_bytes
