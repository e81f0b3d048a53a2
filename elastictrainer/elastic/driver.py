"""The TensorFlow side of ElasticTrainer's runtime: runs the steps the decision part
(runtime.py) asks for, times them and feeds back what they measured.

Any training loop drives it through a few calls:

    runtime = ElasticRuntime(time_model, rho, ...,
                             is_compiled=lambda selection: selection in trainer.steps)
    driver = ElasticDriver(trainer, scheme, runtime, probe_iter, probe_batches)
    driver.on_train_begin()                        # prints the plan (forward floor, ...)
    for each batch (x, y), global step g:
        loss, logits = driver.train_step(g, x, y)  # = before_step + the call + after_step
        at an epoch's end: driver.on_epoch_end(epoch, g)
    driver.on_train_end(train_time_s, g)           # the run's end (state.EndResult)

`before_step(g)` gives the callable to train this batch with (a probe step, a timed full step
or the selection's step) and `after_step(g, seconds, outputs)` books it, for a loop that calls
and times the step itself; the callable takes what the trainer's steps take ((x, y) for
train.compiled.CompiledSteps, a model.fit batch for fit.steps.FitSteps).  TensorBoard scalars
go to the default summary writer, if any.
"""
import functools

import numpy as np
import tensorflow as tf

from elastictrainer import runlog
from elastictrainer.train import steps as train_steps
from elastictrainer.method.importance import IMPORTANCE


class ElasticDriver:
    """Drives `runtime` (an elastic.ElasticRuntime) with `trainer`'s steps (CompiledSteps or
    FitSteps).

    scheme: the --train_type's Scheme; probe_iter: batches for importance estimators that need
    their own backward passes (those without an in-step form, importance.IN_STEP);
    probe_batches: probes per re-selection; announce(global_step, kind, selection), if given,
    is called before each step: a multi-worker run's chief tells the other workers what to run
    (follower.Decisions); pace: a pace.PaceCheck, handed each batch a selection step trains
    (the runtime calls its compare: --pace_check), or None.  The trainer's prefix cache, if
    any, is watched: once it turns off, the runtime is told (cache_off) before the step that
    turned it off is booked."""

    def __init__(self, trainer, scheme, runtime, probe_iter=None, probe_batches=1,
                 announce=None, pace=None):
        self.trainer, self.scheme, self.rt = trainer, scheme, runtime
        self.pace = pace
        self.probe_iter = probe_iter
        self.probe_batches = int(probe_batches)
        self.announce = announce
        self.clock = runtime.clock
        self._cache = getattr(trainer, "prefix_cache", None)
        self._cache_on = self._cache is not None
        self._kind = None
        self._compiled = False
        self._step = None
        self.ran = (None, None)  # (kind, tensors) of the last step, as before_step chose it

    def on_train_begin(self):
        return self.rt.plan()

    @property
    def selection(self):
        return self.rt.selection

    def before_step(self, global_step):
        """The callable (x, y) -> (loss, logits[, terms]) that trains this step."""
        rt, tr = self.rt, self.trainer
        if rt.reselect_due(global_step):
            if tr.in_step:
                rt.begin_reselection(global_step, probes=self.probe_batches)
            else:
                rt.begin_reselection(global_step)
                t0 = self.clock()
                batches = [next(self.probe_iter) for _ in range(self.probe_batches)]
                scores = IMPORTANCE[self.scheme.importance](tr, batches)
                rt.importance_ready(global_step, np.asarray(scores, float),
                                    self.clock() - t0)
        kind = rt.step_kind()
        self._kind = kind
        self.ran = (kind, None if kind != "selection" else rt.selection)
        if self.announce is not None:
            self.announce(global_step, kind, rt.selection)
        if kind in ("probe", "full"):  # every gradient, no update: they train nothing
            want = kind == "probe"
            self._compiled = not tr.probe_traced(want)
            return functools.partial(tr.probe_step, want_terms=want)
        selection = tuple(rt.selection)
        self._compiled = selection not in tr.steps
        self._step = step = tr.step_for(selection)
        if self.pace is None:
            return step

        def held(*data):
            self.pace.hold(data)
            return step(*data)
        return held

    def after_step(self, global_step, seconds, outputs):
        """Book the step `before_step` gave; True when the selection changed."""
        kind = self._kind
        terms = outputs[2].numpy() if kind == "probe" else None
        # a step with its prefix cached says whether it filled the cache and compiled
        step = self._step if kind == "selection" else None
        filled = bool(getattr(step, "filled", False))
        fill_s = getattr(step, "fill_s", 0.0) if filled else 0.0
        compiled = getattr(step, "compiled", self._compiled) or self._compiled
        if self._cache_on and self._cache.off:  # a cache that failed: price without it
            self._cache_on = False
            self.rt.cache_off()
        # the step's loss (its first output, fetched already by the timing): whether the
        # selection pays (trend.py)
        loss = None
        if kind == "selection" and outputs[0] is not None:
            value = outputs[0]
            loss = float(np.mean(value.numpy() if hasattr(value, "numpy") else value))
        changed = self.rt.step_done(global_step, kind, seconds, compiled=compiled,
                                    terms=terms, filled=filled, fill_s=fill_s, loss=loss)
        self.flush_events()
        return changed

    def train_step(self, global_step, x, y):
        """before_step, the step (timed until its first output is ready), after_step."""
        step = self.before_step(global_step)
        t0 = self.clock()
        outputs = step(x, y)
        train_steps.first_output(outputs).numpy()
        seconds = self.clock() - t0
        self.after_step(global_step, seconds, outputs)
        return outputs[0], outputs[1]

    def on_epoch_end(self, epoch, global_step):
        """At an epoch boundary: the queued TensorBoard points are written.  Re-selections fall
        on steps (--interval epochs apart, a fraction of an epoch too), so nothing is decided
        here."""
        self.flush_events()

    def on_train_end(self, train_time_s, global_step):
        """The runtime's state.EndResult (summary.json's numbers, the closing line's words)."""
        result = self.rt.finish(train_time_s)
        self.flush_events()
        if result.wall_ratio is not None:
            self._emit(runlog.WALL_RATIO, result.wall_ratio, global_step)
        return result

    def flush_events(self):
        """Write the runtime's queued TensorBoard points (to the default writer, if any)."""
        for tag, value, step in self.rt.take_events():
            self._emit(tag, value, step)

    def _emit(self, tag, value, step):
        # without a default summary writer these calls do nothing
        if tag == runlog.SELECTION_MASK:
            tf.summary.write(tag, tf.constant(np.asarray(value, np.int32)), step=step)
        elif value is not None:
            tf.summary.scalar(tag, value, step=step)
