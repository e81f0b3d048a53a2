"""The decision part of ElasticTrainer's runtime: events in, decisions out, no TensorFlow.

A training loop (through elastic.driver.ElasticDriver, or any other driver) reports what
happened: the importance of every tensor (eq. 4-6), how long each step took and which kind of
step it was.  The runtime answers with what to run next:

- "probe": every tensor's backward pass, no update, returning each tensor's importance terms
  (eq. 4-6) from the gradients it computes.  A re-selection every --interval epochs runs
  --probe_batches of them.
- "full": the same step, timed beside the selection's own steps (FULL_STEPS per measurement
  round, interleaved), so the closed loop compares like with like (closed_loop.py, its policy
  rho_control.py's); the table's full_over_grads adds the update it leaves out.  Neither kind
  trains: an elastic run trains its selections only, and a few full Adam steps can shake a
  pretrained backbone.
- "selection": the current selection's step, the one that trains only the chosen tensors.

Before the first probes, a newly initialised classifier head trains alone for its first
--head_warmup share of the first interval (the head warm-up, warmup.py): eq. 4-6 measured
through a random head rank tensors by noise, as linear-probe-then-fine-tune practice knows.
After the probes it solves eq. 3 (the exact DP of time_model/selector, through
rho_control.prefer_measured), and its ClosedLoop component (closed_loop.py) opens, measures
and corrects each selection.  Every second is booked by accounting.py (the run's wall-clock
estimate and its re-selection overhead); what a run may spend on re-selecting is decided by
its Economy component (economy.py, --economy), except that a selection whose training loss
did not fall over its interval, or that falls behind full training's pace (its Judge component,
judge.py), or whose share of the estimated loss drop faded (trend.py), is replaced whatever the
budget says (under rho auto, by a wider one: budget.py).  Its state is
one typed object (ElasticState) that a checkpoint keeps, and its clock is injected, so tests
script step times.

What it gives out is read-only and typed (Plan, SelectionRecord, Correction, EndResult, the
TensorBoard points it queued: take_events); state() and load_state() for checkpoints.
"""
import time
from typing import Callable

import numpy as np

from elastictrainer import runlog
from elastictrainer.elastic import accounting, realized, trend
from elastictrainer.elastic.budget import (DEFAULT_OBJECTIVE, DEFAULT_SHARE, Budget,
                                           head_warmup_share)
from elastictrainer.elastic.closed_loop import ClosedLoop
from elastictrainer.elastic.economy import ECONOMY_OFF, FULL_TRAINING, Economy
from elastictrainer.elastic.judge import Judge
from elastictrainer.elastic.prices import Prices
from elastictrainer.elastic.rho_control import (CONFIRM_ROUNDS, FULL_STEPS, MEASURE_STEPS,
                                                RhoController)
from elastictrainer.elastic.warmup import HeadWarmup
from elastictrainer.elastic.state import (HEAD_WARMUP, SHORT_RUN, Correction, ElasticState,
                                          EndResult, Plan, SelectionRecord)
from elastictrainer.method.importance import normalize

# rho within this of the forward floor: warned at the start (few tensors fit, accuracy drops)
FLOOR_MARGIN = 0.1


class ElasticRuntime:
    """ElasticTrainer's runtime decisions for one run.

    model: the run's TimeModel (eq. 3); rho, feedback: --rho (a ratio, with `tolerance`, or
    "auto" with `share` and `objective`: budget.py), --rho_feedback; steps_per_epoch,
    total_steps, interval: where re-selections fall; probe_batches: probe steps per
    re-selection; dp_resolution: the DP's; economy: --economy (economy.py), and
    economy_off_words how the run's user turns it off, in its lines; compile_ms: a
    selection step's compile as the timing table has it, or None; is_compiled(selection):
    whether the driver has that selection's step compiled already (a tuple of tensor
    indices; the full step is every index); profiling_s: seconds this process spent profiling
    the timing table for the run (0 when it read one), inside the driver's training clock
    (profiled_in_clock: model.fit profiles on its first batch) or before it (the command
    line), counted against the run in wall_ratio (accounting.py).  head: the classifier
    head's tensor indices (method.roles' "head"), and head_warmup: the share of the first
    interval they train alone before the first probes (0: none).  trial(masks): the trainer's
    trial step by depth (--trial_check: method/trial.py, realized.py), None without;
    pace(selection): the loss drops of full training and of `selection` from the same weights
    on the same batches (--pace_check: pace.PaceCheck.compare), None without.  clock:
    seconds (time.perf_counter); log(message).
    """

    def __init__(self, model, rho, *, share=DEFAULT_SHARE, objective=DEFAULT_OBJECTIVE,
                 tolerance=0.0, feedback=True, steps_per_epoch,
                 total_steps, interval=1.0, probe_batches=1, dp_resolution=10000,
                 compile_ms=None, economy=True, economy_off_words=ECONOMY_OFF,
                 is_compiled: Callable = lambda selection: False, profiling_s=0.0,
                 profiled_in_clock=False, head=(), head_warmup=0.0, trial=None,
                 pace=None, clock: Callable[[], float] = time.perf_counter, log=print):
        self.budget = Budget(rho, share, objective, tolerance)
        self.resolution = int(dp_resolution)
        # rho auto: the target is each selection's own; until the first, what the share would
        # amount to with every tensor alike in importance (Budget.auto_start), which the economy
        # prices the start at
        start = (self.budget.auto_start(model, self.resolution) if self.budget.auto
                 else self.budget.rho)
        self.ctl = RhoController(model, start, feedback)
        self.steps_per_epoch = int(steps_per_epoch)
        self.total_steps = int(total_steps)
        self.every = interval * steps_per_epoch
        self.probe_batches = int(probe_batches)
        self._bucket = trend.bucket_steps(self.every)
        self.clock = clock
        self.log = log
        self.n = len(model.t_dw)
        prices = Prices(economy, self.ctl, total_steps=total_steps,
                        steps_per_epoch=steps_per_epoch, probe_batches=probe_batches,
                        compile_ms=compile_ms)
        self._economy = Economy(prices, every=self.every, is_compiled=is_compiled,
                                auto=self.budget.auto, off_words=economy_off_words, log=log)
        self._loop = ClosedLoop(self.ctl, self.budget, self._economy,
                                resolution=self.resolution, steps_per_epoch=steps_per_epoch,
                                clock=clock, log=log, emit=self._emit)
        self._warmup = HeadWarmup(head, head_warmup_share(head_warmup, rho), self.n,
                                  min(self.every, self.total_steps), self.budget.share,
                                  self._loop, log)
        # TensorBoard points, queued: the driver writes them (take_events) outside the timed
        # parts, since a summary op's first call is slow and is logging, not re-selecting
        self._events = []
        self._profiling_s = float(profiling_s)
        # a driver profiles always inside its clock or always before it, resumed or not
        self._profiled_in_clock = bool(profiled_in_clock)
        self._trial = trial
        self._judge = Judge(pace, self.budget.auto, clock=clock, log=log)
        self._s = ElasticState()
        self._s.profiling_s = self._profiling_s

    # ------------------------------------------------------------------ the start
    def plan(self):
        """The forward floor, how many tensors rho affords, and a warning near the floor; a
        fresh run too short to pay for a selection's compile trains every tensor (economy)."""
        model, auto, s = self.ctl.model, self.budget.auto, self._s
        mask = model.select(np.ones(self.n), 1.0 if auto else self.rho, resolution=self.resolution)
        fresh = s.selection is None and not s.records
        # a run that will train every tensor is warned of no floor: its next line says why
        settles = fresh and self._economy.start_choice() == FULL_TRAINING
        plan = Plan(total_steps=self.total_steps, forward_floor=model.rho_floor,
                    affordable_tensors=int(mask.sum()), num_tensors=self.n,
                    near_floor=(not auto and not settles
                                and self.rho - model.rho_floor < FLOOR_MARGIN),
                    corrected=(self.ctl.dw_scale, self.ctl.dy_scale) != (1.0, 1.0),
                    profiling_s=self._profiling_s,
                    saves_at_most_s=(self._economy.prices.saving_at_s(model.rho_floor)
                                     if fresh else None))
        for line in plan.lines(self.budget.text, FLOOR_MARGIN,
                               model.without_cache().rho_floor if model.cache else None):
            self.log(line)
        if fresh and self._economy.settles_at_start():
            s.settled = True  # every tensor for the whole run, with no re-selection
            self._loop.open(s, 0, np.ones(self.n, bool), None, SHORT_RUN)
        return plan

    # ------------------------------------------------------------------ what it gives out
    @property
    def rho(self):
        """The step ratio selections are held to: rho, or --rho auto's current target."""
        return self.ctl.rho

    @property
    def measuring(self):
        """Whether the current selection is being measured (full steps are still asked for)."""
        return bool(self._s.measuring)

    @property
    def records(self):
        """The selections so far (summary.json's "selections"), oldest first, as copies."""
        return tuple(SelectionRecord(**r) for r in self._s.records)

    @property
    def corrections(self):
        """The closed loop's corrections so far (summary.json's "corrections"), as copies."""
        return tuple(Correction(**c) for c in self._s.corrections)

    @property
    def selection(self):
        """The current selection's tensor indices, None before the first."""
        return None if self._s.selection is None else tuple(self._s.selection)

    @property
    def mask(self):
        """The current selection as one bool per tensor, None before the first."""
        return None if self._s.mask is None else tuple(self._s.mask)

    def measured_so_far(self):  # the selections' step-weighted measured ratio (None: not yet)
        return accounting.measured_so_far(self._s)

    def take_events(self):  # the queued TensorBoard points [(tag, value, step)], emptied
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------------ what to run
    def reselect_due(self, global_step):
        """Whether a re-selection starts at `global_step`.  One the overhead budget cannot pay
        for is skipped here (economy.py): the selection is kept until the next, unless its
        loss did not fall (trend.py).  A fresh run's first call opens the head warm-up, if
        any, and none starts before it ends."""
        s = self._s
        if s.selection is None and not s.settled and self._warmup.steps:
            self._warmup.open(s, global_step)
        if s.settled or s.probing or s.warmup_left or global_step < s.next_reselect:
            return False
        # a selection whose loss did not fall, or behind full training's pace, is re-probed
        # past the budget (judge.py)
        why = self._judge.before_probes(s, global_step)
        if not self._economy.probes_affordable(global_step, self._progress(), why):
            s.next_reselect = max(s.next_reselect + self.every, global_step + 1)
            s.losses = []  # the next interval is judged on its own steps
            return False
        return True

    def begin_reselection(self, global_step, probes=None):
        """Open a re-selection at `global_step`: `probes` probe steps follow (in-step
        importance), or None when the caller evaluates importance itself (importance_ready)."""
        s = self._s
        self._close_record(global_step)
        s.next_reselect = max(s.next_reselect + self.every, global_step + 1)
        s.corrections_here, s.was_over = 0, False
        if probes:
            s.probing, s.probe_terms, s.probe_s = int(probes), [0.0] * self.n, 0.0

    def step_kind(self):
        """Which step the next batch trains: "probe", "full" or "selection"."""
        s = self._s
        if s.probing:
            return "probe"
        if not s.measuring or s.selection is None:
            return "selection"
        return "full" if self._loop.wants_full(s) else "selection"

    # ------------------------------------------------------------------ events
    def importance_ready(self, global_step, importance, seconds):
        """Importance evaluated outside the steps (on probe batches) in `seconds`: solve."""
        accounting.book_overhead(self._s, "importance", seconds)
        self._select(global_step, np.asarray(importance, float), importance_ms=seconds * 1e3)

    def step_done(self, global_step, kind, seconds, compiled=False, terms=None, filled=False,
                  fill_s=0.0, loss=None):
        """Book one trained step of `kind` that took `seconds` (`compiled`: its function was
        traced for this call; `filled`: a selection step that stored images in the prefix
        cache, running its prefix on them first, which took `fill_s` of its seconds; `loss`:
        its training loss, None if the driver has none).  Returns True when the selection
        changed."""
        s = self._s
        if loss is not None and kind == "selection":
            trend.add(s.losses, loss, self._bucket)
        if filled and kind == "selection":
            fill_s = min(max(fill_s, 0.0), seconds)
            accounting.book_fill(s, fill_s)
            seconds -= fill_s  # the rest is the cached step the selection was priced for
        if kind in ("probe", "full"):
            accounting.book_full(s, seconds, compiled, kind == "probe", self.ctl.base)
        if kind == "probe":
            s.probes_run += 1
            s.probe_terms = [a + float(b) for a, b in zip(s.probe_terms, terms)]
            s.probing -= 1
            if s.probing:
                return False
            importance = normalize(np.asarray(s.probe_terms, float))
            s.probe_terms = None
            if self._trial is not None:  # held to what a step realizes by depth (realized.py)
                t0 = self.clock()
                importance = realized.check(self._trial, importance, self.log)
                checked = self.clock() - t0
                accounting.book_overhead(s, "importance", checked)
                s.probe_s += checked
            self._select(global_step + 1, importance, importance_ms=s.probe_s * 1e3)
            return True
        if kind == "full":
            if s.record_open:
                s.records[-1]["full_step_ms"] = accounting.full_ms(s)
            return False
        return self._selection_step(global_step, seconds, compiled)

    def cache_off(self):
        """The prefix cache is off for the rest of the run (it failed): select without it."""
        self.ctl.drop_cache()

    def _selection_step(self, global_step, seconds, compiled=False):
        s = self._s
        if s.warmup_left:
            accounting.book_selection_step(s, seconds, compiled, prices=False)
            self._warmup.step_done(s, global_step)
            return False
        if accounting.book_selection_step(s, seconds, compiled):
            return False  # its first: it may have compiled, and is not timed
        return self._loop.step_timed(s, global_step)

    # ------------------------------------------------------------------ selecting
    def _select(self, global_step, importance, importance_ms=None):
        s = self._s
        t0 = self.clock()
        s.importance = [float(v) for v in importance]
        stalled, words, failing = self._judge.verdict(s)
        widen = failing and self.budget.auto
        if widen:  # towards full training (budget.py)
            s.min_ratio = self.budget.widened(self.ctl.model, s.mask, s.min_ratio)
            self.log(f"elastic: step {global_step}: {stalled}: rho auto widens towards full "
                     f"training: from here on a cheaper selection is replaced by eq. 3's "
                     f"under {s.min_ratio:.3f} of a full step")
        mask, measured_before = self._loop.solve(s)
        reason = "interval"
        selection = tuple(int(k) for k in np.nonzero(mask)[0])
        first = s.selection is None or s.records[-1]["reason"] == HEAD_WARMUP
        if first and self._warmup.goes_on(s, global_step, selection):
            accounting.book_overhead(s, "solving", self.clock() - t0)
            return
        if first or len(s.selection) == self.n:
            if not self._economy.pays_off(mask, global_step, self._progress()):
                mask, reason = np.ones(self.n, bool), SHORT_RUN
        elif selection == tuple(s.selection) and widen:
            s.min_ratio = 1.0  # the widened ratio buys nothing more: full training's step
            mask, reason = np.ones(self.n, bool), "interval (widened: every tensor)"
            self.log(f"elastic: step {global_step}: the widened step buys no other tensor: "
                     f"every tensor trains from here on")
        elif selection == tuple(s.selection):
            if stalled:
                self._economy.same_again(global_step, stalled)
        elif not self._economy.worth_compiling(selection, global_step, self._progress()):
            faded = None if stalled else trend.faded(s.selection, selection, importance)
            if (stalled or faded) and self._economy.replaces(
                    global_step, self._progress(), stalled or faded, selection):
                reason = ("interval (replaced: loss did not fall)" if stalled else
                          "interval (replaced: its estimated loss drop faded)")
            else:
                self._economy.kept(global_step, why=words)
                mask, reason = np.asarray(s.mask, bool), "interval (kept: overhead budget)"
        # the same tensors as before, already measured: no new measurement (the re-check
        # every RECHECK_STEPS still comes)
        again = s.selection is not None and [int(k) for k in np.nonzero(mask)[0]] == list(
            s.selection) and any(m[0] == list(s.selection) for m in s.measured)
        known = dict((tuple(k), v) for k, v in s.measured)[tuple(s.selection)] if again else None
        self._loop.open(s, global_step, mask, measured_before, reason, importance_ms,
                        known_ratio=known)
        spent = self.clock() - t0
        s.records[-1]["solve_ms"] = spent * 1e3
        accounting.book_overhead(s, "solving", spent)

    def _progress(self):
        return accounting.progress(self._s)

    def _close_record(self, global_step):
        """Close the current record; a ratio only its closing measured (its one window cut
        short by the re-selection) goes to TensorBoard too, as a judged window's does."""
        s = self._s
        unmeasured = s.record_open and s.records[-1].get("measured_ratio") is None
        accounting.close_record(s)
        if unmeasured and s.records[-1].get("measured_ratio") is not None:
            self._emit(runlog.MEASURED_RATIO, s.records[-1]["measured_ratio"], global_step)

    def _emit(self, tag, value, step):
        self._events.append((tag, value, int(step)))

    # ------------------------------------------------------------------ the end
    def finish(self, train_time_s):
        """The run's end (EndResult): step ratios measured and estimated, re-selection overhead,
        wall_ratio (accounting.py), the economy's choice, and the closing line's words."""
        s = self._s
        measured, estimated, spent, parts, wall = accounting.close_run(
            s, train_time_s, self._profiled_in_clock)
        economy = self._economy.record()
        closing = accounting.closing_words(
            self.budget.text, measured, estimated, len(s.corrections), spent, wall, train_time_s,
            self._economy.closing(), full_training=economy["choice"] == FULL_TRAINING,
            unmeasured_why=self._economy.unmeasured_why(), profiling_s=s.profiling_s)
        if s.warmup_steps:
            closing += f"; head warm-up: {s.warmup_steps - s.warmup_left} steps"
        if s.unconfirmed and not s.corrections and self.ctl.feedback:
            closing += (f"; {s.unconfirmed} miss(es) of rho left unconfirmed: a selection "
                        f"stopped before the {CONFIRM_ROUNDS} rounds of {MEASURE_STEPS} of its "
                        f"steps and {FULL_STEPS} full steps that confirm one (a longer interval "
                        f"than {int(self.every)} steps lets the run correct)")
        return EndResult(measured_ratio=measured, estimated_ratio=estimated,
                         reselection_overhead_s=spent, reselection_overhead_parts_s=parts,
                         wall_ratio=wall, economy=economy, closing=closing,
                         profiling_s=s.profiling_s,
                         profiling_in_train_time=self._profiled_in_clock)

    # ------------------------------------------------------------------ checkpoints
    def state(self):
        """Everything the runtime knows, as plain data for a checkpoint (ElasticState)."""
        s = self._s
        s.controller = self.ctl.state()
        s.economy = self._economy.state()
        return s.to_dict()

    def load_state(self, data):
        self._s = ElasticState.from_dict(data)
        # a resumed run keeps what its earlier processes spent profiling, and adds its own
        self._s.profiling_s += self._profiling_s
        # the first selection step after resuming compiles again; the steps' kinds stay those
        # of the run left alone (step_kind reads first_step_s), only that step's time is booked
        # apart (accounting.book_selection_step)
        self._s.recompile = self._s.first_step_s is not None
        if self._s.controller:
            self.ctl.load_state(self._s.controller)
        if self.budget.auto and self._s.records:  # the target of the selection resumed
            self.ctl.rho = self._s.records[-1].get("rho") or self.ctl.rho
        self._economy.load_state(self._s.economy)
