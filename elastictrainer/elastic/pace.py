"""Whether a selection keeps up with full training (--pace_check; not in the paper): under
`--rho auto`, at each re-selection, the selection that trained the last interval and full
training each take the same few steps from the same weights, and the loss each brings per
second of its steps is compared.  A selection that clearly falls behind full training's pace
widens the run towards full training (budget.py, as a selection whose loss did not fall does).

Why: the estimate (eq. 4-6) decides which tensors train, and across a domain shift it can pick
a selection whose loss falls, but slowly: the loss-trend rule (trend.py) sees it falling and
keeps it, while every tensor trained would have gone further per second.  No share of the
estimate answers that, since the estimate is what misled; only training the other tensors
does.  So the check trains them, on batches the run has already seen, and puts everything back.

How (PaceCheck.compare, TensorFlow; one device):
- the last BATCHES batches the selection trained on are held (the driver hands them over);
- the weights, the optimizer's state, BatchNorm's moving statistics and the model's metrics are
  kept; from them, a step of every tensor (the run's optimizer) runs once on each held batch,
  then each batch's training loss is read; everything is put back, and the same is done with a
  step of the selection's tensors alone; everything is put back again;
- per batch i, full training's drop f_i and the selection's s_i (from the loss before both).

The rule (trend.behind, plain numpy): the selection's step takes r of a full step (measured by
the closed loop, else predicted), so per second of full step it brings s_i / r.  With
d_i = f_i - s_i / r, the selection is behind when the mean of d exceeds trend.PACE_T standard
errors of it: the batches are paired (the same batches, the same start), so the test asks
whether full training is faster on these batches beyond what their spread allows, not whether
it is faster by some fixed margin.  Fewer than trend.PACE_MIN_BATCHES batches are not judged.

What it cannot see: a gap in test accuracy that accrues over epochs while the selection keeps
pace step by step.  On the textures target (docs/performance.md, "The pace check") every check
found the selection ahead per second, on the batches trained and on batches neither arm
trained, while the run ended 7 points under full training.
"""
from collections import deque

import numpy as np
import tensorflow as tf

from elastictrainer.elastic import trend
from elastictrainer.flavors import for_model, optimizers
from elastictrainer.flavors.shared import inference_calls

# Batches held and trained in each arm: 2 x BATCHES steps and 3 x BATCHES forward passes per
# check, about 4 s on EfficientNet-Lite0 at 96 px, batch 8, on 2 cores (40 full steps' time)
BATCHES = 8


def for_trainer(trainer, on, log):
    """The run's PaceCheck when `on` (--pace_check), None otherwise, and None with a line
    saying why where it cannot run: under tf.distribute, or with the prefix cache on."""
    if not on:
        return None
    if getattr(trainer, "dist", None) or getattr(trainer, "strategy", None) is not None:
        why = "it runs on one device, not under tf.distribute"
    elif trainer.prefix_cache is not None:
        why = "the prefix cache's steps train on stored activations, not the batches it holds"
    else:
        return PaceCheck(trainer)
    log(f"elastic: the pace check is off: {why}")
    return None


class PaceCheck:
    """Holds the last BATCHES batches a selection trained on (hold) and compares, from the
    weights as they are, a step of every tensor with a step of a selection's on them (compare).
    trainer: train.compiled.CompiledSteps or fit.steps.FitSteps on one device, without a prefix
    cache (its steps take stored activations, not batches), whose loss_of(data) is the training
    loss of a batch as its steps compute it.

    Both arms run one step compiled once for the run (the trainer keeps one selection's step
    compiled, so its own steps would compile two more at every check): every tensor's gradient,
    the optimizer's update of the masked ones, and the others put back.  The arms differ in
    their mask alone, so they differ in which tensors move, not in how a step is computed;
    under bn_mode "frozen" both run BatchNorm as a full step does."""

    def __init__(self, trainer):
        self.trainer = trainer
        model = trainer.model
        self._random = for_model(model).random_layers(model)
        self._held = deque(maxlen=BATCHES)
        self._size = None  # the held batches' sizes (full batches)
        variables = list(trainer.variables)
        handles = [optimizers.tf_variable(v) for v in variables]
        optimizer, loss_of = trainer.optimizer, trainer.loss_of

        def masked_step(data, mask):
            before = [tf.identity(w) for w in handles]
            with tf.GradientTape() as tape:
                loss = loss_of(data)
            grads = tape.gradient(loss, variables)
            grads = [None if g is None else g * tf.cast(mask[i], g.dtype)
                     for i, g in enumerate(grads)]
            optimizers.apply_updates(optimizer, grads, variables)
            # a masked-off tensor's momentum or weight decay still moved it: back
            for i, (w, b) in enumerate(zip(handles, before)):
                w.assign(b + tf.cast(mask[i], b.dtype) * (w - b))
            return loss

        # autograph off: no Python control flow on tensors
        self._step = tf.function(masked_step, autograph=False)
        self._loss = tf.function(loss_of, autograph=False)

    def hold(self, data):
        """Hold a batch a selection step trains on (the oldest goes beyond BATCHES).  A batch
        of another size than the first held (an epoch's last, partial one) is not held: the
        check's step would be traced again for it."""
        data = tuple(data)
        size = tuple(int(part.shape[0]) for part in data if hasattr(part, "shape"))
        if self._size is None:
            self._size = size
        if size == self._size:
            self._held.append(data)

    def _kept(self):
        tr = self.trainer
        return (list(tr.model.weights) + list(tr.optimizer.variables)
                + [v for metric in getattr(tr.model, "metrics", []) for v in metric.variables])

    def _losses(self, held):
        with inference_calls(self._random):  # no dropout mask drawn anew per pass
            return np.array([float(self._loss(data)) for data in held])

    def _arm(self, mask, held, put_back):
        mask = tf.constant(mask, tf.float32)
        for data in held:
            self._step(data, mask)
        after = self._losses(held)
        put_back()
        return after

    def compare(self, selection):
        """(full, selection): each held batch's loss drop from the weights as they are, after
        one step of every tensor / of `selection` on each held batch in turn; None with fewer
        than trend.PACE_MIN_BATCHES held.  Everything the steps and forward passes move is put
        back; the held batches are released."""
        held, self._held = list(self._held), deque(maxlen=BATCHES)
        if len(held) < trend.PACE_MIN_BATCHES:
            return None
        if self.trainer.bn_hold is not None:  # both arms run BatchNorm as a full step does
            self.trainer.bn_hold.hold(None)
        put_back = optimizers.snapshot(self._kept())
        base = self._losses(held)
        put_back()  # the forward passes moved BatchNorm's statistics
        n = len(self.trainer.variables)
        chosen = np.zeros(n, np.float32)
        chosen[list(selection)] = 1.0
        full = self._arm(np.ones(n, np.float32), held, put_back)
        mine = self._arm(chosen, held, put_back)
        return base - full, base - mine
