"""The closed loop on each selection, run on the runtime's state (rho_control.py holds its
policy and its fit; not in the paper, which trusts its time model).

- Solved: eq. 3's exact selection under rho with the time model as corrected so far (through
  budget.py: rho, or --rho auto's objective, whose ratio becomes the loop's target), or a
  selection this run measured within rho that is worth more (rho_control.prefer_measured).
- Opened: its record (state.SelectionRecord: why it is what it is, its predicted ratio, what
  limited it), the state its steps start from, and how it is measured, as the economy affords
  (economy.measurement: in full, read out, or not at all).
- Measured: its own steps timed against timed full steps interleaved with them (FULL_STEPS a
  round), a window's ratio the median of its steps over the median of its full steps, judged
  by the controller (keep, confirm on another round, correct); a judged selection is measured
  again every RECHECK_STEPS of its steps, in case the load or the device changed.
- Corrected after a confirmed miss: the controller refits the time model's backward scale and
  fixed cost over its measurements, eq. 3 is solved again under it, and the new selection
  opens at once, unless the overhead budget does not pay for compiling it (economy.py).

ElasticRuntime (runtime.py) builds one and calls it with its state (state.ElasticState), which
a resumed run replaces, so the state is an argument here, never kept.
"""
import numpy as np

from elastictrainer import runlog
from elastictrainer.elastic import accounting
from elastictrainer.elastic.economy import READOUT_FULL_STEPS
from elastictrainer.elastic.rho_control import (FULL_STEPS, MEASURE_STEPS, RECHECK_STEPS,
                                                prefer_measured)
from elastictrainer.elastic.state import Correction, SelectionRecord


class ClosedLoop:
    """The closed loop of one run.  controller: its RhoController (the time model, rho, the
    policy); budget: its Budget (budget.py); economy: its Economy; resolution: the DP's;
    steps_per_epoch; clock: seconds; log(message); emit(tag, value, step): a TensorBoard point
    for the runtime to queue."""

    def __init__(self, controller, budget, economy, *, resolution, steps_per_epoch, clock, log,
                 emit):
        self.ctl = controller
        self.budget = budget
        self.economy = economy
        self.resolution = int(resolution)
        self.steps_per_epoch = int(steps_per_epoch)
        self.n = len(controller.base.t_dw)
        self.clock = clock
        self.log = log
        self.emit = emit

    # ------------------------------------------------------------------ solving and opening
    def solve(self, s):
        """Eq. 3's exact selection under rho with the current (corrected) time model, or a
        selection this run measured within rho that is worth more (prefer_measured), or, when
        neither trains anything, the budget's fallback: (mask, its ratio measured earlier in
        this run or None)."""
        model = self.ctl.model
        importance = np.asarray(s.importance, float)
        mask, target = self.budget.solve(model, importance, self.resolution, s.min_ratio)
        if self.budget.auto:  # the closed loop holds the ratio this selection amounts to
            self.ctl.rho = target
        measured = {tuple(k): v for k, v in s.measured}
        mask, measured_before = prefer_measured(mask, importance, measured, self.ctl.rho,
                                                self.ctl.tolerance)
        cheapest, empty = model.selection(mask)
        if empty:  # a step that trains nothing lowers no loss: the cheapest tensor at least
            mask = self.budget.fallback(cheapest, importance, s.selection, self.n, self.log)
        return mask, measured_before

    def open(self, s, global_step, mask, measured_before, reason, importance_ms=None,
             known_ratio=None, measure=True):
        """Start training `mask`; known_ratio: its step ratio, measured in this run moments ago
        (the same tensors again): not measured again until the re-check; measure false: not
        measured at all (the head warm-up)."""
        model, mask, rho = self.ctl.model, np.asarray(mask, bool), self.ctl.rho
        ratio = model.predicted_ratio(mask)
        importance = None if s.importance is None else np.asarray(s.importance, float)
        choice = (None if importance is None else  # rho auto: why this selection (budget.py)
                  self.budget.explain(model, importance, mask, self.resolution,
                                      s.min_ratio))
        record = SelectionRecord(
            step=int(global_step), epoch=global_step / self.steps_per_epoch, reason=reason,
            mask=[int(b) for b in mask], predicted_ratio=ratio,
            limited_by="budget" if importance is None else self.budget.objective
            if self.budget.auto
            else model.limited_by(mask, importance, rho, resolution=self.resolution),
            solve_ms=0.0, importance=[] if importance is None else [float(v) for v in importance],
            measured_before=measured_before, importance_ms=importance_ms,
            full_step_ms=accounting.full_ms(s), cut=model.cut_name(mask), rho=rho,
            **({} if choice is None else choice.record_fields()))
        if choice is not None:
            self.log(choice.line(self.n))
        everything = bool(mask.all())
        if everything:  # the full step itself: its ratio is 1, nothing to measure
            record.measured_ratio, record.limited_by = 1.0, "budget"
        elif known_ratio is not None:
            record.measured_ratio = known_ratio
        s.records.append(record.to_dict())
        s.record_open = True
        s.selection = [int(k) for k in np.nonzero(mask)[0]]
        s.mask = [bool(b) for b in mask]
        s.times, s.first_step_s, s.losses = [], None, []
        s.rounds, s.win_t, s.win_f = 1, 0, len(s.full_times)
        how = (self.economy.measurement(global_step, mask, accounting.progress(s))
               if known_ratio is None and not everything and measure else None)
        s.measuring, s.readout = how is not None, how == "readout"
        s.windows, s.first_window = [[0.0, 1.0 if everything else known_ratio]], 0
        self.emit(runlog.NUM_SELECTED, len(s.selection), global_step)
        self.emit(runlog.PREDICTED_RATIO, ratio, global_step)
        self.emit(runlog.SELECTION_RHO, rho, global_step)
        self.emit(runlog.SELECTION_MASK, s.mask, global_step)
        for tag, value in choice.events() if choice is not None else ():
            self.emit(tag, value, global_step)

    # ------------------------------------------------------------------ measuring
    def wants_full(self, s):
        """Whether the next batch of a selection being measured is a timed full step."""
        full, own = len(s.full_times) - s.win_f, len(s.times) - s.win_t
        # interleaved with the selection's own first steps (before its steps 0, 2, 4, ...), so
        # that load which comes and goes hits both alike
        return full < self.full_needed(s) and 2 * full <= own and s.first_step_s is not None

    def full_needed(self, s):
        return READOUT_FULL_STEPS if s.readout else FULL_STEPS * s.rounds

    def step_timed(self, s, global_step):
        """After a timed step of the current selection (not its first): start a re-check, or
        close the measurement window and act on its ratio.  True when the selection changed."""
        rec = s.records[-1]
        if not s.measuring:
            # a selection trains for --interval epochs, an hour or more on a small device: its
            # ratio is measured again now and then, in case the load or the device changed
            # every tensor trains (full training's step): its ratio is 1 by definition, and a
            # recheck's timed full steps would only skip batches of what is full training
            if (not all(s.mask) and len(s.times) - s.win_t >= RECHECK_STEPS
                    and self.economy.prices.steps_left(global_step) > 2 * MEASURE_STEPS
                    and self.economy.recheck_affordable(global_step, accounting.progress(s))):
                s.win_t, s.win_f = len(s.times), len(s.full_times)
                s.rounds, s.measuring, s.readout = 1, True, False
                s.windows.append([0.0, None])
            return False
        if (len(s.times) - s.win_t != MEASURE_STEPS * s.rounds
                or len(s.full_times) - s.win_f < self.full_needed(s)):
            return False
        measured = accounting.window_ratio(s)
        rec["measured_ratio"] = measured
        s.windows[-1][1] = measured
        accounting.remember(s, s.selection, measured)
        self.emit(runlog.MEASURED_RATIO, measured, global_step)
        if s.readout:  # read out, not acted on (economy.py)
            s.win_t, s.measuring, s.readout = len(s.times), False, False
            return False
        action, miss = self.ctl.decide(measured, rec["limited_by"], s.was_over,
                                       rec["predicted_ratio"], s.rounds, s.corrections_here)
        if action == "keep":
            s.win_t, s.measuring = len(s.times), False  # judged: until the re-check
            return False
        if action == "confirm":
            s.rounds += 1
            return False
        return self.correct(s, global_step, measured, miss)

    # ------------------------------------------------------------------ correcting
    def correct(self, s, global_step, measured, miss):
        """A confirmed miss (`miss`: "over" or "under" rho) at `measured`: refit the time model,
        solve again and open the new selection if the budget pays for its compile, else keep
        the current one unjudged until the re-check.  True when the selection changed."""
        t0 = self.clock()
        self.ctl.correct(np.asarray(s.mask, bool), measured)
        s.corrections_here += 1
        s.was_over = s.was_over or miss == "over"
        old_sel, old_rec, old_rho = tuple(s.selection), s.records[-1], self.ctl.rho
        mask, measured_before = self.solve(s)
        new_sel = self.ctl.model.selection(mask)[0]
        if new_sel != old_sel and not self.economy.worth_compiling(new_sel, global_step,
                                                                    accounting.progress(s)):
            self.economy.kept(global_step, (len(old_sel), measured))
            s.corrections_here = self.ctl.max_corrections
            s.win_t, s.measuring = len(s.times), False
            accounting.book_overhead(s, "solving", self.clock() - t0)
            return False
        s.measuring = False  # its miss confirmed and corrected: closed as judged
        accounting.close_record(s)
        same = new_sel == old_sel  # measured just now: no second measurement of it
        self.open(s, global_step + 1, mask, measured_before, f"correction ({miss} rho)",
                  known_ratio=measured if same else None)
        model = self.ctl.model
        s.corrections.append(Correction(
            step=global_step, measured_ratio=measured, miss=miss,
            predicted_ratio_before=old_rec["predicted_ratio"], dw_scale=self.ctl.dw_scale,
            dy_scale=self.ctl.dy_scale, fixed_ms=model.fixed_ms,
            selected_before=len(old_sel), selected_after=len(s.selection)).to_dict())
        self.emit(runlog.CORRECTIONS, len(s.corrections), global_step)
        self.log(f"rho feedback: {len(old_sel)} tensors measured {measured:.3f} of a full step "
                 f"for rho {old_rho:g} (predicted {old_rec['predicted_ratio']:.3f}); time "
                 f"model corrected (backward ops x{self.ctl.dw_scale:.2f} of the table's, fixed "
                 f"cost {model.fixed_ms:+.1f} ms a step), now {len(s.selection)} tensors"
                 + ("" if measured_before is None else
                    f" (measured {measured_before:.3f} earlier in this run)"))
        if tuple(s.selection) == old_sel:  # the same tensors again: nothing left to correct
            s.corrections_here = self.ctl.max_corrections
        spent = self.clock() - t0
        s.records[-1]["solve_ms"] = spent * 1e3
        accounting.book_overhead(s, "solving", spent)
        return True
