"""The trial step by depth (not in the paper): what one step of a group of tensors realizes on
the probe's batch, against what the first-order estimate (eq. 4-6 as `taylor` computes it,
importance.py) predicts for it.

Why: under SGD the first-order estimate is lr |g|^2.  Across a domain shift the tensors that see
pixels have by far the largest gradients, so they get most of the estimated loss drop, yet
training them alone raises the held-out loss (figures/bench_importance_truth.md: the 70%
selection of the first-order estimate, 9 tensors down to the first convolution, raised it by
0.086).  A step as long as momentum makes a steady one meets curvature in proportion to its
length squared, which the first-order term leaves out: large, noisy gradients overshoot.  A
group's realized share, measured here, corrects every estimate in that group
(elastic/realized.py), which keeps what the estimate ranks well (within a depth) and takes
back what it promises wrongly (across depths).

TrialStep.keep(data, grads) holds each probe's batch and the gradient g the probe took on it
(a re-selection's --probe_batches of them); drops(masks) takes, for each, the step dw0 a fresh
optimizer state takes from g (as `taylor`, importance.fresh_drops), stretched to the length
momentum gives a steady step, s = 1 / (1 - momentum) (importance.momentum_stretch), and for each
mask (a group of tensors) returns (predicted, realized) on that batch, summed over the batches:

    predicted = s (-g . dw0) over the mask's tensors (first order)
    realized  = L(w) - L(w + s dw0 on the mask's tensors)

Summed, because one batch's shares are noise where the steps overshoot: on EfficientNet-Lite0 on
textures the checked estimate ranked tensors by the truth at +0.19 to +0.74 from each of 8 probe
batches alone, and at +0.64 from their sums (docs/performance.md, "Importance against the
truth").  One forward pass per mask and batch, plus one per batch for L(w) (the backward pass is
the probe's); the weights and the statistics the forward passes move (BatchNorm's moving
averages) are put back.  The batches and gradients are held until drops() releases them: a
re-selection's probes' worth, no more.  Given a rule (`enough`, elastic/realized.py's
backtracking), drops() measures the same batches again with the plain step (s = 1, one step of
the optimizer from a fresh state) when the stretched step's shares fail it.

On the same batch, not a held-out one: measured on held-out batches the shares were noise at a
probe's batch size (their signs flipped from one pair of batches to the next); on the same
batch, across the nested domain shift, they were the same from one probe batch to eight
(docs/performance.md, "Importance against the truth").
"""
import tensorflow as tf

from elastictrainer.flavors import optimizers
from elastictrainer.flavors.shared import inference_calls
from elastictrainer.method.importance import fresh_drops, momentum_stretch


class TrialStep:
    """optimizer, variables: the trainer's (every trainable tensor); loss_of(data): the
    training loss of a batch (a training forward pass) as the trainer's steps compute it;
    stats: the variables those passes move and that are put back (non-trainable weights, and
    the metrics a model.fit forward pass updates), or a function giving them at each trial
    (metrics are built on a fit's first step); random_layers: the model's layers that draw
    random numbers in training mode (flavor.random_layers), run in inference mode in the
    trial's passes: with a dropout mask drawn anew for L(w) and for L(w + s dw), part of
    their difference is the masks' (on EfficientNet-Lite0, whose head has Dropout(0.2), a
    step that moves nothing "realized" -0.15 to +0.27 on batches of 8, where the median depth
    group's step realizes 0.71)."""

    def __init__(self, optimizer, variables, loss_of, stats=(), random_layers=()):
        self.optimizer, self.variables = optimizer, list(variables)
        self.random_layers = list(random_layers)
        self._stats = stats if callable(stats) else (lambda: list(stats))
        self.stretch = momentum_stretch(optimizer)
        self._held = []

        def fresh(grads):
            steps, first = fresh_drops(self.optimizer, grads, self.variables)
            return steps, self.stretch * first

        def after(data, steps, masks):
            """L(w) and L(w + s dw0 on each mask) on `data` (masks: one row of 0/1 per mask),
            L(w) once; everything put back after each mask's pass.  The masks run in a
            tf.while_loop, so that the graph holds two forward passes whatever their number:
            unrolled, the domain shift's MobileNetV2 (158 tensors) took 133 s to build and run
            its 17 passes the first time, in the loop 10 s."""
            weights = [optimizers.tf_variable(v) for v in self.variables]
            kept = [tf.identity(w) for w in weights]
            with tf.control_dependencies(kept):
                base = tf.identity(loss_of(data))

            def one(row, losses):  # one mask's pass from w, w put back after it
                moved = [w.assign(k + tf.cast(self.stretch * masks[row, i], k.dtype) * d)
                         for i, (w, k, d) in enumerate(zip(weights, kept, steps))]
                with tf.control_dependencies(moved):
                    loss = tf.identity(loss_of(data))
                with tf.control_dependencies([loss]):
                    back = [w.assign(k) for w, k in zip(weights, kept)]
                with tf.control_dependencies(back):
                    return row + 1, losses.write(row, tf.cast(loss, tf.float32))

            count = tf.shape(masks)[0]
            with tf.control_dependencies([base]):
                _, losses = tf.while_loop(
                    lambda row, _: row < count, one,
                    [tf.constant(0), tf.TensorArray(tf.float32, size=count)])
            return tf.identity(base), losses.stack()

        # autograph off: no Python control flow on tensors (and TensorFlow 2.16 converts
        # calls of objects into calls of their class)
        self._fresh = tf.function(fresh, autograph=False)
        self._after = tf.function(after, autograph=False)
        self.n = len(self.variables)

    def keep(self, data, grads):
        """Hold a probe's batch and the gradients it took on it, beside those held since the
        last drops()."""
        self._held.append((tuple(data), list(grads)))

    def drops(self, masks, enough=None):
        """(pairs, plain): pairs, [(predicted, realized)] per mask (a list of 0/1 per tensor),
        summed over the batches kept since the last call, or None when none is kept; plain:
        whether they are the plain step's, measured when `enough(pairs)` (given) says the
        stretched step's are not enough and the stretch is above 1.  Releases the batches."""
        held, self._held = self._held, []
        if not held:
            return None, False
        pairs = self._pairs(masks, held, 1.0)
        if enough is None or self.stretch <= 1.0 or enough(pairs):
            return pairs, False
        return self._pairs(masks, held, 1.0 / self.stretch), True

    def _pairs(self, masks, held, scale):
        """The pairs of a step `scale` times the stretched one, on `held` batches."""
        # the statistics every forward pass here moves, put back at the end (in training mode
        # the losses do not depend on them)
        put_back = optimizers.snapshot(self._stats())
        rows = tf.constant(masks, tf.float32) * scale  # each step: s x scale x dw0
        out = [[0.0, 0.0] for _ in masks]
        with inference_calls(self.random_layers):
            for batch, grads in held:
                steps, first = self._fresh(grads)
                first = first.numpy()
                base, losses = self._after(batch, steps, rows)
                for k, (mask, loss) in enumerate(zip(masks, losses.numpy())):
                    out[k][0] += scale * float(sum(first[i] for i, m in enumerate(mask) if m))
                    out[k][1] += float(base) - float(loss)
        put_back()
        return [tuple(pair) for pair in out]
