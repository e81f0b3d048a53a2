"""What an elastic run may spend on re-selecting (--economy): the rules that keep the
runtime's overhead in proportion to the run.

Runs too short to pay for a selection's compile.  Switching from the full step to a selection
costs one compile (the profiler's compile_ms, timed on its calibration's reference selections;
else estimated from the full step's own first call).  A switch whose predicted saving over the steps left is under PAYOFF times that cost would make
the run slower than full training: the runtime keeps training every tensor then, and says so.
Later switches (re-selections, corrections) to a selection not compiled yet are made only while
the run's re-selection overhead, that compile and the full steps that measure it included,
stays within OVERHEAD_SHARE of the run's training time.
"""
import statistics

import numpy as np

from elastictrainer.elastic.rho_control import FULL_STEPS

# A switch away from full steps must save this multiple of its compile; below it the run keeps
# full steps (a compile is estimated from the full step's, which may be off by a third).
PAYOFF = 1.5
# The re-selection overhead a run may reach with later switches to uncompiled selections, as a
# share of its training time (and a compile's share of the steps left).
OVERHEAD_SHARE = 0.10
# Later switches plan for this much of it: a compile estimated from the last one came out up to
# a third low here (the first compile of a process pays TensorFlow's warm-up).
PLANNED_SHARE = 0.8 * OVERHEAD_SHARE


class Economy:
    """The economy half of ElasticRuntime (which it is mixed into): reads its state `self.s`,
    time model `self.ctl`, `self.rho`, `self.total_steps`, `self.every`, `self.probe_batches`,
    `self.n`, `self.compile_ms`, `self.economy` and `self.is_compiled`."""

    def _say_if_short(self, compile_s):
        """Say once, at the start, when re-selecting will be held back to stay worth it."""
        if getattr(self, "_said_short", False) or not self.economy:
            return
        self._said_short = True
        step_s = self.ctl.model.t_full / 1e3
        saving = self.total_steps * (1 - self.rho) * step_s
        if compile_s * 1 / OVERHEAD_SHARE > saving:
            self.log(f"short run: {self.total_steps} steps save about {saving:.1f} s at rho "
                     f"{self.rho:g}, and compiling a selection's step costs about "
                     f"{compile_s:.1f} s; re-selections and corrections switch only to steps "
                     f"that pay for their compile"
                     + (", and all tensors train if none does" if saving < PAYOFF * compile_s
                        else ""))

    def _pays_off(self, mask, global_step):
        """Whether leaving full steps for `mask` saves more than its compile costs."""
        ratio = self.ctl.model.predicted_ratio(mask)
        compile_s = self._compile_estimate(ratio)
        if compile_s is None or mask.all() or self.is_compiled(
                tuple(int(k) for k in np.nonzero(mask)[0])):
            return True
        saving = self._steps_left(global_step) * (1 - ratio) * self._t_full_s()
        if saving >= PAYOFF * compile_s:
            return True
        if not getattr(self, "_said_full", False):
            self._said_full = True
            self.log(f"elastic: the {self._steps_left(global_step)} steps left would save about "
                     f"{saving:.2f} s, not {PAYOFF:g}x the {compile_s:.2f} s that compiling a "
                     f"selection's step is estimated to cost: training all tensors, as full "
                     f"training would (--economy false to select anyway)")
        return False

    def _worth_compiling(self, selection, global_step):
        """Whether a later switch (a re-selection or a correction) to `selection` may compile
        its step: the overhead so far, this compile, the full steps that will measure it and
        the probes of the re-selections still to come must stay within PLANNED_SHARE of the
        run's training time, taken as its steps at the lowest step ratio in sight (rho, the
        current selection's, the new one's: loop work would only add to it); and the compile
        within that share of the time the steps left will take."""
        compile_s = self._compile_estimate(self.rho)
        if compile_s is None or self.is_compiled(tuple(selection)):
            return True
        s, base = self.s, self.ctl.base
        t_full = self._t_full_s()
        grad_s = t_full / base.full_over_grads
        mask = np.zeros(self.n, bool)
        mask[list(selection)] = True
        ratios = [self.rho, self.ctl.model.predicted_ratio(mask)]
        if s.records:
            ratios.append(s.records[-1]["measured_ratio"] or s.records[-1]["predicted_ratio"])
        step_s = min(ratios) * t_full
        left = self._steps_left(global_step)
        probes_s = left / max(self.every, 1) * self.probe_batches * grad_s
        projected = self._spent_s() + compile_s + FULL_STEPS * grad_s + probes_s
        return (projected <= PLANNED_SHARE * self.total_steps * step_s
                and compile_s <= OVERHEAD_SHARE * left * step_s)

    def _t_full_s(self):
        """A full step in seconds: measured in this run (feedback on), else the table's."""
        s = self.s
        if self.ctl.feedback and s.full_times:
            return statistics.median(s.full_times)
        return self.ctl.base.t_full / 1e3

    def _spent_s(self):
        """Re-selection overhead so far: as booked (feedback on); with feedback off, from the
        table alone (selections compiled, probe and full steps run), so that no decision
        depends on this run's timing."""
        s = self.s
        if self.ctl.feedback:
            return self.overhead_s
        compiles = len({tuple(r["mask"]) for r in s.records if not all(r["mask"])})
        grad_s = self.ctl.base.t_full / 1e3 / self.ctl.base.full_over_grads
        return (compiles * (self._compile_estimate(self.rho) or 0.0)
                + (len(s.full_times) + s.probes_run) * grad_s)

    def _compile_estimate(self, ratio):
        """Seconds a new selection's step of predicted step ratio `ratio` takes to compile: the
        last one measured in this run; before any, the table's compile_ms (timed by the
        profiler on selections), else the full step's compile measured on its first call times
        `ratio` (a selection's graph holds the forward pass and part of the backward one; the
        first compile of a process also pays TensorFlow's own warm-up: smallcnn's full step
        took 1.4 s, its selections' 0.4 s); None when unknown.  With feedback off, decisions
        must not depend on this run's timing: only the table's value counts then."""
        s = self.s
        if not self.economy:
            return None
        table_s = None if self.compile_ms is None else self.compile_ms / 1e3
        if not self.ctl.feedback:
            return table_s
        if s.selection_compile_s is not None:
            return s.selection_compile_s
        if table_s is not None:
            return table_s
        return None if s.full_compile_s is None else s.full_compile_s * ratio

    def _steps_left(self, global_step):
        return max(self.total_steps - global_step, 0)
