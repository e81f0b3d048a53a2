"""The decision part of ElasticTrainer's runtime: events in, decisions out, no TensorFlow.

A training loop (through elastic.driver.ElasticDriver, or any other driver) reports what
happened: the importance of every tensor (eq. 4-6), how long each step took and which kind of
step it was.  The runtime answers with what to run next:

- "probe": every tensor's backward pass, no update, returning each tensor's importance terms
  (eq. 4-6) from the gradients it computes.  A re-selection every --interval epochs runs
  --probe_batches of them.
- "full": the same step, timed beside the selection's own steps (FULL_STEPS per measurement
  round, interleaved), so the closed loop compares like with like (rho_control.py); the
  table's full_over_grads adds the update it leaves out.  Neither kind trains: an elastic run
  trains its selections only, and a few full Adam steps can shake a pretrained backbone.
- "selection": the current selection's step, the one that trains only the chosen tensors.

After the probes it solves eq. 3 (the exact DP of time_model/selector, through
rho_control.prefer_measured), and it books every second into the parts that make the run's
wall-clock estimate and its re-selection overhead.  Its state is one typed object
(ElasticState) that a checkpoint keeps, and its clock is injected, so tests script step times.

Every second is booked by the accounting part (accounting.py: the run's wall-clock estimate
and its re-selection overhead).

What a run may spend on re-selecting is economy.py's (--economy).
"""
import dataclasses
import statistics
import time
from typing import Callable

import numpy as np

from elastictrainer import runlog
from elastictrainer.elastic.accounting import Accounting
from elastictrainer.elastic.economy import OVERHEAD_SHARE, Economy
from elastictrainer.elastic.rho_control import (FULL_STEPS, MEASURE_STEPS, RECHECK_STEPS,
                                                RhoController, prefer_measured)
from elastictrainer.elastic.state import (SHORT_RUN, Correction, ElasticState, Plan,
                                          SelectionRecord)
from elastictrainer.method.importance import normalize

# rho within this of the forward floor: warned at the start (few tensors fit, accuracy drops)
FLOOR_MARGIN = 0.1


class ElasticRuntime(Economy, Accounting):
    """ElasticTrainer's runtime decisions for one run.

    model: the run's TimeModel (eq. 3); rho, feedback: --rho, --rho_feedback; steps_per_epoch,
    total_steps, interval: where re-selections fall; probe_batches: probe steps per
    re-selection; dp_resolution: the DP's; economy: switch only to selections that pay for
    their compile (module doc); compile_ms: a selection step's compile known before the run
    (the timing table's), else estimated from the full step's.  clock: seconds (time.perf_counter);
    log(message).  TensorBoard points wait in `events` as (tag, value, step), runlog's tags.
    """

    def __init__(self, model, rho, *, feedback=True, steps_per_epoch, total_steps,
                 interval=1.0, probe_batches=1, dp_resolution=10000, compile_ms=None,
                 economy=True,
                 clock: Callable[[], float] = time.perf_counter, log=print):
        self.ctl = RhoController(model, rho, feedback)
        self.rho = float(rho)
        self.steps_per_epoch = int(steps_per_epoch)
        self.total_steps = int(total_steps)
        self.every = interval * steps_per_epoch
        self.probe_batches = int(probe_batches)
        self.resolution = int(dp_resolution)
        self.compile_ms = compile_ms
        self.economy = bool(economy)
        self.clock = clock
        self.log = log
        # TensorBoard points, queued: the caller writes them (flush_events) outside the timed
        # parts, since a summary op's first call is slow and is logging, not re-selecting
        self.events = []
        self.s = ElasticState()
        self.n = len(model.t_dw)
        self.is_compiled = lambda selection: False  # the TF side says which steps exist
        self.said = set()  # the notes the economy gives once

    # ------------------------------------------------------------------ the start
    def plan(self):
        """The forward floor, how many tensors rho affords, and a warning near the floor."""
        model = self.ctl.model
        mask = model.select(np.ones(self.n), self.rho, resolution=self.resolution)
        plan = Plan(total_steps=self.total_steps, forward_floor=model.rho_floor,
                    affordable_tensors=int(mask.sum()), num_tensors=self.n,
                    near_floor=self.rho - model.rho_floor < FLOOR_MARGIN)
        cached = (f" with the prefix cached, {model.without_cache().rho_floor:.2f} without"
                  if model.cache else "")
        self.log(f"elastic: forward floor {plan.forward_floor:.2f} of a full step (training "
                 f"nothing{cached}); rho {self.rho:g} affords up to {plan.affordable_tensors} "
                 f"of {self.n} tensors under the time model")
        if plan.near_floor:
            self.log(f"warning: rho {self.rho:g} is within {FLOOR_MARGIN:g} of the forward floor "
                     f"({plan.forward_floor:.2f}): few tensors fit, expect the accuracy of "
                     f"training little more than the head")
        if self.compile_ms is not None:
            self._say_if_short(self.compile_ms / 1e3)
        if (self.economy and self.s.selection is None and not self.s.records
                and self._settles_at_start()):
            self._settle()
        return plan

    def _settle(self):
        """Train every tensor for the whole run, with no re-selection (a run too short to pay
        for a selection, economy.py)."""
        self.s.settled = True
        self._open(0, np.ones(self.n, bool), None, SHORT_RUN)

    # ------------------------------------------------------------------ what to run
    @property
    def measuring(self):
        """Whether the current selection is being measured (full steps are still asked for)."""
        return bool(self.s.measuring)

    @property
    def records(self):
        """The selection records so far (summary.json's "selections"), oldest first."""
        return self.s.records

    @property
    def corrections(self):
        """The closed loop's corrections so far (summary.json's "corrections")."""
        return self.s.corrections

    def reselect_due(self, global_step):
        """Whether a re-selection starts at `global_step`.  One the overhead budget cannot pay
        for is skipped here (economy.py): the selection is kept until the next."""
        s = self.s
        if s.settled or s.probing or global_step < s.next_reselect:
            return False
        if not self._probes_affordable(global_step):
            s.next_reselect = max(s.next_reselect + self.every, global_step + 1)
            return False
        return True

    def begin_reselection(self, global_step, probes=None):
        """Open a re-selection at `global_step`: `probes` probe steps follow (in-step
        importance), or None when the caller evaluates importance itself (importance_ready)."""
        s = self.s
        self._close_record()
        s.next_reselect = max(s.next_reselect + self.every, global_step + 1)
        s.corrections_here, s.was_over = 0, False
        if probes:
            s.probing, s.probe_terms = int(probes), [0.0] * self.n

    def step_kind(self):
        """Which step the next batch trains: "probe", "full" or "selection"."""
        s = self.s
        if s.probing:
            return "probe"
        if not s.measuring or s.selection is None:
            return "selection"
        full, own = len(s.full_times) - s.win_f, len(s.times) - s.win_t
        # interleaved with the selection's own first steps (before its steps 0, 2, 4, ...), so
        # that load which comes and goes hits both alike
        if full < FULL_STEPS * s.rounds and 2 * full <= own and s.first_step_s is not None:
            return "full"
        return "selection"

    # ------------------------------------------------------------------ events
    def importance_ready(self, global_step, importance, seconds):
        """Importance evaluated outside the steps (on probe batches) in `seconds`: solve."""
        self._overhead("importance", seconds)
        self._select(global_step, np.asarray(importance, float), importance_ms=seconds * 1e3)

    def step_done(self, global_step, kind, seconds, compiled=False, terms=None, filled=False):
        """Book one trained step of `kind` that took `seconds` (`compiled`: its function was
        traced for this call; `filled`: a selection step that stored images in the prefix
        cache, running its prefix on them first).  Returns True when the selection changed."""
        s = self.s
        if filled and kind == "selection":
            return self._book_fill(seconds)
        if kind == "probe":
            self._book_full(seconds, compiled, probe=True)
            s.probes_run += 1
            s.probe_terms = [a + float(b) for a, b in zip(s.probe_terms, terms)]
            s.probing -= 1
            if s.probing:
                return False
            importance = normalize(np.asarray(s.probe_terms, float))
            s.probe_terms = None
            self._select(global_step + 1, importance)
            return True
        if kind == "full":
            self._book_full(seconds, compiled, probe=False)
            if s.record_open:
                s.records[-1]["full_step_ms"] = self._full_ms()
            return False
        return self._selection_step(global_step, seconds, compiled)

    def _book_full(self, seconds, compiled, probe):
        """A probe or timed full step: every tensor's backward pass, no update.  It trains
        nothing, so all its seconds are overhead; full training would have trained its batch
        at a full step's cost, its seconds times the table's full_over_grads (the update's
        share of a step)."""
        s = self.s
        over = self.ctl.base.full_over_grads
        if compiled:
            typical = (statistics.median(s.full_times) / over if s.full_times
                       else self.ctl.base.t_full / 1e3 / over)
            s.full_compile_s = max(seconds - typical, 0.0)
            if self.compile_ms is None and self.ctl.feedback:
                self._say_if_short(s.full_compile_s * self.rho)
            seconds -= s.full_compile_s  # the full step's compile: full training pays it too
        s.full_s += seconds * over
        if probe:
            self._overhead("importance", seconds)
        else:
            self._overhead("timing full steps", seconds)
            s.full_times.append(seconds * over)
            if s.record_open:
                s.records[-1]["full_steps"] += 1

    def _selection_step(self, global_step, seconds, compiled=False):
        s = self.s
        rec = s.records[-1]
        rec["steps"] += 1
        s.windows[-1][0] += seconds
        if s.first_step_s is None:  # may include compiling this selection's step
            s.first_step_s, s.first_window = seconds, len(s.windows) - 1
            s.first_compiled = bool(compiled)
            return False
        s.times.append(seconds)
        if len(s.times) == 1 and not all(s.mask) and s.first_compiled:
            s.selection_compile_s = max(s.first_step_s - seconds, 0.0)
        if not s.measuring:
            # a selection trains for --interval epochs, an hour or more on a small device: its
            # ratio is measured again now and then, in case the load or the device changed
            if (len(s.times) - s.win_t >= RECHECK_STEPS
                    and self._steps_left(global_step) > 2 * MEASURE_STEPS
                    and self._affordable(FULL_STEPS * self._grad_s(), global_step)):
                s.win_t, s.win_f = len(s.times), len(s.full_times)
                s.rounds, s.measuring = 1, True
                s.windows.append([0.0, None])
            return False
        if (len(s.times) - s.win_t != MEASURE_STEPS * s.rounds
                or len(s.full_times) - s.win_f < FULL_STEPS * s.rounds):
            return False
        measured = self._measured()
        rec["measured_ratio"] = measured
        s.windows[-1][1] = measured
        self._remember(s.selection, measured)
        self._emit(runlog.MEASURED_RATIO, measured, global_step)
        action, miss = self.ctl.decide(measured, rec["limited_by"], s.was_over,
                                       rec["predicted_ratio"], s.rounds, s.corrections_here)
        if action == "keep":
            s.win_t, s.measuring = len(s.times), False  # judged: until the re-check
            return False
        if action == "confirm":
            s.rounds += 1
            return False
        return self._correct(global_step, measured, miss)

    def _correct(self, global_step, measured, miss):
        s = self.s
        t0 = self.clock()
        base_mask = np.asarray(s.mask, bool)
        self.ctl.correct(base_mask, measured)
        s.corrections_here += 1
        s.was_over = s.was_over or miss == "over"
        old_sel, old_rec = tuple(s.selection), s.records[-1]
        mask, measured_before = self._solve()
        new_sel = self.ctl.model.selection(mask)[0]
        if new_sel != old_sel and not self._worth_compiling(new_sel, global_step):
            self.log(f"rho feedback: {len(old_sel)} tensors measured {measured:.3f} of a full "
                     f"step for rho {self.rho:g}; the {self._steps_left(global_step)} steps "
                     f"left do not pay for compiling another selection (overhead budget "
                     f"{OVERHEAD_SHARE:.0%} of training), kept")
            s.corrections_here = self.ctl.max_corrections
            s.win_t, s.measuring = len(s.times), False
            self._overhead("solving", self.clock() - t0)
            return False
        self._close_record()
        same = new_sel == old_sel  # measured just now: no second measurement of it
        self._open(global_step + 1, mask, measured_before, f"correction ({miss} rho)",
                   known_ratio=measured if same else None)
        model = self.ctl.model
        s.corrections.append(dataclasses.asdict(Correction(
            step=global_step, measured_ratio=measured, miss=miss,
            predicted_ratio_before=old_rec["predicted_ratio"], dw_scale=self.ctl.dw_scale,
            dy_scale=self.ctl.dy_scale, fixed_ms=model.fixed_ms,
            selected_before=len(old_sel), selected_after=len(s.selection))))
        self._emit(runlog.CORRECTIONS, len(s.corrections), global_step)
        self.log(f"rho feedback: {len(old_sel)} tensors measured {measured:.3f} of a full step "
                 f"for rho {self.rho:g} (predicted {old_rec['predicted_ratio']:.3f}); time "
                 f"model corrected (backward ops x{self.ctl.dw_scale:.2f} of the table's, fixed "
                 f"cost {model.fixed_ms:+.1f} ms a step), now {len(s.selection)} tensors"
                 + ("" if measured_before is None else
                    f" (measured {measured_before:.3f} earlier in this run)"))
        if tuple(s.selection) == old_sel:  # the same tensors again: nothing left to correct
            s.corrections_here = self.ctl.max_corrections
        self._overhead("solving", self.clock() - t0)
        return True

    # ------------------------------------------------------------------ selecting
    def _solve(self):
        """Eq. 3's exact selection under rho with the current (corrected) time model, or a
        selection this run measured within rho that is worth more (prefer_measured)."""
        model, s = self.ctl.model, self.s
        importance = np.asarray(s.importance, float)
        mask = model.select(importance, self.rho, resolution=self.resolution)
        measured = {tuple(k): v for k, v in s.measured}
        return prefer_measured(mask, importance, measured, self.rho, self.ctl.tolerance)

    def _select(self, global_step, importance, importance_ms=None):
        s = self.s
        t0 = self.clock()
        s.importance = [float(v) for v in importance]
        mask, measured_before = self._solve()
        selection, empty = self.ctl.model.selection(mask)
        reason = "interval"
        if empty:
            mask = np.zeros(self.n, bool)
            if not np.any(importance > 0) and s.selection is not None:
                mask[list(s.selection)] = True
                self.log("no tensor has positive importance; keeping the previous selection "
                         f"({len(s.selection)} tensors)")
            else:
                mask[list(selection)] = True
                self.log("no tensor has positive importance; training the output-most tensor "
                         "only" if not np.any(importance > 0) else
                         f"no tensor worth training fits rho {self.rho:g} under this time "
                         f"model; training the output-most (cheapest) tensor only")
        selection = tuple(int(k) for k in np.nonzero(mask)[0])
        if s.selection is None or len(s.selection) == self.n:
            if not self._pays_off(mask, global_step):
                mask, reason = np.ones(self.n, bool), SHORT_RUN
        elif selection != tuple(s.selection) and not self._worth_compiling(selection,
                                                                           global_step):
            mask, reason = np.asarray(s.mask, bool), "interval (kept: overhead budget)"
        # the same tensors as before, already measured: no new measurement (the re-check
        # every RECHECK_STEPS still comes)
        again = s.selection is not None and [int(k) for k in np.nonzero(mask)[0]] == list(
            s.selection) and any(m[0] == list(s.selection) for m in s.measured)
        known = dict((tuple(k), v) for k, v in s.measured)[tuple(s.selection)] if again else None
        self._open(global_step, mask, measured_before, reason, importance_ms, known_ratio=known)
        self._overhead("solving", self.clock() - t0)

    def _open(self, global_step, mask, measured_before, reason, importance_ms=None,
              known_ratio=None):
        """Start training `mask`; known_ratio: its step ratio, measured in this run moments ago
        (the same tensors again): not measured again until the re-check."""
        s = self.s
        model = self.ctl.model
        mask = np.asarray(mask, bool)
        ratio = model.predicted_ratio(mask)
        importance = None if s.importance is None else np.asarray(s.importance, float)
        record = SelectionRecord(
            step=int(global_step), epoch=global_step / self.steps_per_epoch, reason=reason,
            mask=[int(b) for b in mask], predicted_ratio=ratio,
            limited_by="budget" if importance is None else model.limited_by(
                mask, importance, self.rho, resolution=self.resolution),
            solve_ms=0.0, importance=[] if importance is None else [float(v) for v in importance],
            measured_before=measured_before, importance_ms=importance_ms,
            full_step_ms=self._full_ms(), cut=model.cut_name(mask))
        everything = bool(mask.all())
        if everything:  # the full step itself: its ratio is 1, nothing to measure
            record.measured_ratio, record.limited_by = 1.0, "budget"
        elif known_ratio is not None:
            record.measured_ratio = known_ratio
        s.records.append(record.to_dict())
        s.record_open = True
        s.selection = [int(k) for k in np.nonzero(mask)[0]]
        s.mask = [bool(b) for b in mask]
        s.times, s.first_step_s = [], None
        s.rounds, s.win_t, s.win_f = 1, 0, len(s.full_times)
        s.measuring = (known_ratio is None and not everything
                       and self._measure_affordable(global_step, mask))
        s.windows, s.first_window = [[0.0, 1.0 if everything else known_ratio]], 0
        self._emit(runlog.NUM_SELECTED, len(s.selection), global_step)
        self._emit(runlog.PREDICTED_RATIO, ratio, global_step)
        self._emit(runlog.SELECTION_MASK, s.mask, global_step)

    def cache_off(self):
        """The prefix cache is off for the rest of the run (it failed): select without it."""
        self.ctl.drop_cache()

    # ------------------------------------------------------------------ checkpoints
    def state(self):
        s = self.s
        s.controller = self.ctl.state()
        return s.to_dict()

    def load_state(self, data):
        self.s = ElasticState.from_dict(data)
        self.s.first_step_s = None  # the first step after resuming compiles again
        self.s.first_window = len(self.s.windows) - 1
        if self.s.controller:
            self.ctl.load_state(self.s.controller)

