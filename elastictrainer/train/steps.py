"""The compiled steps of one device, shared by the profiler and the training loop: a training step
(the selected tensors' gradients and their update), the probe step (every gradient, no
update, with importance terms), the gradient and forward steps the profiler times.

One definition of "a training step" keeps the profiled graph and the trained graph the same:
what the Tensor Timing Profiler measures is what training later runs.  The optimizer's update
runs through the model's Keras (flavors.optimizers.apply_updates).  tf.distribute's steps are
in distributed_steps.py.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tensorflow as tf
import tf_keras as keras

from elastictrainer.flavors import compat, optimizers


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
    apply = optimizers.apply_updates

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

    # whether the terms take the probe's batch too (importance.CurvatureTerms); the distributed
    # probe step never does (compiled.CompiledSteps refuses such importance under a strategy)
    needs_batch = False
    # keep((x, y), grads): given the batch and gradients of each probe that computes its terms
    # (method/trial.py's TrialStep holds the last, so it takes no backward pass); one device
    # only, as the trial step is
    keep = None

    def __init__(self, model, optimizer, loss_fn, var_list, terms_fn=None, penalty_fn=None,
                 keep=None):
        var_list = list(var_list)
        self.n = len(var_list)
        self.keep = keep

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
                total = loss + penalty_fn() if penalty_fn is not None else loss
            return loss, logits, tape.gradient(total, var_list)

        self.step = step
        self.needs_batch = bool(getattr(terms_fn, "needs_batch", False))
        if self.needs_batch:  # a second gradient on the probe's batch (importance.CurvatureTerms)
            from elastictrainer.method.importance import hessian_vector_product

            terms_fn.stats = list(model.non_trainable_weights)

            def loss_of(data):
                loss = loss_fn(data[1], model(data[0], training=True))
                return loss + penalty_fn() if penalty_fn is not None else loss

            hvp_at = hessian_vector_product(loss_of, var_list)
            # autograph off: TensorFlow 2.16's converts a call of the terms object into a call
            # of its class; the terms have no Python control flow on tensors
            self.terms = tf.function(lambda x, y, grads: terms_fn(grads, hvp_at, (x, y)),
                                     autograph=False)
        else:
            self.terms = None if terms_fn is None else tf.function(terms_fn)

    def traced(self, want_terms=False):
        """Whether calling with `want_terms` compiles nothing new."""
        def has(fn):
            return bool(compat.concrete_functions(fn))

        return has(self.step) and (not want_terms or self.terms is None or has(self.terms))

    def __call__(self, x, y, want_terms=False):
        loss, logits, grads = self.step(x, y)
        if want_terms and self.keep is not None:
            self.keep((x, y), grads)
        if want_terms and self.terms is not None:
            terms = self.terms(x, y, grads) if self.needs_batch else self.terms(grads)
        else:
            terms = tf.zeros([self.n], tf.float64)
        return loss, logits, terms


def make_probe_step(model, optimizer, loss_fn, var_list, terms_fn=None, penalty_fn=None,
                    keep=None):
    """The probe step of `var_list` (ProbeStep)."""
    return ProbeStep(model, optimizer, loss_fn, var_list, terms_fn, penalty_fn, keep)


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
