"""What an elastic run may spend on re-selecting (--economy): the rules that keep the
runtime's overhead in proportion to the run, and a short run no slower than full training.

An elastic run's batches cost what full training's cost, except its selections' steps, which
save (1 - ratio) of a full step each: probes and timed full steps compute every gradient and
train nothing, about a full step.  Against that saving it pays for compiling each selection's
step (the profiler's compile_ms, timed on its calibration's reference selections; else estimated
from the full step's own first call).

- At the start: a run whose steps, all at rho, would save less than PAYOFF times a compile
  trains every tensor from its first step with full training's own step, and never probes: it
  is full training, neither slower nor heavier in memory.  Once probed, the selection is the
  cheaper way on (its graph is part of the full step's, so it compiles faster than the full
  step would).
- Later spending is held to a budget: a re-selection's probes, the full steps that measure a
  selection (and re-check it), and a switch to a selection not compiled yet happen only while
  the run's re-selection overhead, that spending included, stays within PLANNED_SHARE of its
  training time.  What the budget leaves out is skipped: the selection is kept, or trained
  on the time model's word without measuring it, and the run says so once.
- With the frozen prefix cached (--cache_frozen_prefix), a switch that moves the cut fills the
  cache again: an epoch of steps each running the new prefix once more.  It is priced with the
  switch's compile, so a selection that breaks the cache must fit the same budget.
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
    time model `self.ctl`, `self.rho`, `self.total_steps`, `self.steps_per_epoch`,
    `self.every`, `self.probe_batches`, `self.n`, `self.compile_ms`, `self.economy`,
    `self.is_compiled`."""

    def _say_if_short(self, compile_s):
        """Say once, at the start, when re-selecting will be held back to stay worth it."""
        if getattr(self, "_said_short", False) or not self.economy:
            return
        self._said_short = True
        saving = self._best_saving_s(0)
        if saving < PAYOFF * compile_s:
            return  # _settles_at_start says what happens instead
        if compile_s / OVERHEAD_SHARE > saving:
            self.log(f"short run: {self.total_steps} steps save about {saving:.1f} s at rho "
                     f"{self.rho:g}, and compiling a selection's step costs about "
                     f"{compile_s:.1f} s; re-selections, measurements and corrections are held "
                     f"to {OVERHEAD_SHARE:.0%} of training")

    def _best_saving_s(self, global_step):
        """What the steps left save at best: all but one re-selection's probes train a
        selection at rho."""
        steps = max(self._steps_left(global_step) - self.probe_batches, 0)
        return steps * (1 - self.rho) * self._t_full_s()

    def _settles_at_start(self):
        """Whether the run, at its start, cannot pay for one selection's compile (module
        doc): it then trains every tensor throughout and never probes."""
        compile_s = self._compile_estimate(self.rho)
        if compile_s is None:
            return False
        saving = self._best_saving_s(0)
        if saving >= PAYOFF * compile_s:
            return False
        self.log(f"elastic: the {self.total_steps} steps would save about {saving:.2f} s at rho "
                 f"{self.rho:g}, not {PAYOFF:g}x the {compile_s:.2f} s that compiling a "
                 f"selection's step costs: training all tensors with full training's step, "
                 f"no re-selection (--economy false to select anyway)")
        return True

    def _pays_off(self, mask, global_step):
        """Whether leaving full steps for `mask` saves more than its compile costs.  After a
        probe, the full step is one more compile too unless it exists already, and a larger one
        than a selection's: the selection pays then."""
        if (self._compile_estimate(1.0) is None or mask.all()
                or not self.is_compiled(tuple(range(self.n)))
                or self.is_compiled(tuple(int(k) for k in np.nonzero(mask)[0]))):
            return True
        ratio = self.ctl.model.predicted_ratio(mask)
        compile_s = self._compile_estimate(ratio)
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

    def _affordable(self, extra_s, global_step, step_ratio=None):
        """Whether spending `extra_s` more on re-selecting fits both budgets: the run's
        overhead within PLANNED_SHARE of its training time, taken as its steps at the lowest
        step ratio in sight (rho, the current selection's, `step_ratio`: loop work would only
        add to it); and within 1 / PAYOFF of what the run saves at best, so that it stays
        faster than full training.  A short run whose first compile alone takes the share
        spends nothing more: no later probe, measurement or compile."""
        if not self.economy:
            return True
        spent = self._spent_s() + extra_s
        share = PLANNED_SHARE * self.total_steps * self._lowest_step_s(step_ratio)
        return spent <= share and spent <= self._best_saving_s(0) / PAYOFF

    def _lowest_step_s(self, step_ratio=None):
        """A selection's step in seconds at the lowest step ratio in sight (_affordable)."""
        s = self.s
        ratios = [self.rho] + ([step_ratio] if step_ratio is not None else [])
        if s.records:
            ratios.append(s.records[-1]["measured_ratio"] or s.records[-1]["predicted_ratio"])
        return min(ratios) * self._t_full_s()

    def _grad_s(self):
        """A probe or timed full step (every gradient, no update), in seconds."""
        return self._t_full_s() / self.ctl.base.full_over_grads

    def _probes_affordable(self, global_step):
        """Whether this re-selection's probes fit the budget (a skipped one keeps the selection
        until the next)."""
        if self.s.selection is None:
            return True  # the first selection: the plan decided the run selects
        ok = self._affordable(self.probe_batches * self._grad_s(), global_step)
        if not ok:
            self._say_once("probes", f"elastic: re-selections from step {global_step} on are "
                           f"skipped: their probes would take the re-selection overhead past "
                           f"{OVERHEAD_SHARE:.0%} of training (the selection is kept)")
        return ok

    def _say_once(self, what, line):
        if what not in self.said:
            self.said.add(what)
            self.log(line)

    def _measure_affordable(self, global_step, mask):
        """Whether measuring `mask`'s step (FULL_STEPS timed full steps per round) fits the
        budget, its compile included if not compiled yet."""
        selection = tuple(int(k) for k in np.nonzero(mask)[0])
        extra = FULL_STEPS * self._grad_s()
        if not self.is_compiled(selection):
            extra += self._compile_estimate(self.ctl.model.predicted_ratio(mask)) or 0.0
        ok = self._affordable(extra, global_step, self.ctl.model.predicted_ratio(mask))
        if not ok:
            self._say_once("measure", f"elastic: selections from step {global_step} on train on "
                           f"the time model's word, unmeasured: timing full steps beside them "
                           f"would take the re-selection overhead past {OVERHEAD_SHARE:.0%} of "
                           f"training")
        return ok

    def _worth_compiling(self, selection, global_step):
        """Whether a later switch (a re-selection or a correction) to `selection` may compile
        its step and, when it moves the prefix cache's cut, fill the cache again (_refill_s):
        the overhead so far, these, the full steps that will measure it and the probes of the
        re-selections still to come must fit the budget (_affordable); and the compile and
        refill within OVERHEAD_SHARE of the time the steps left will take."""
        mask = np.zeros(self.n, bool)
        mask[list(selection)] = True
        compile_s = self._compile_estimate(self.rho)
        if compile_s is None or self.is_compiled(tuple(selection)):
            compile_s = 0.0
        once = compile_s + self._refill_s(mask)
        if once == 0:
            return True
        ratio = self.ctl.model.predicted_ratio(mask)
        left = self._steps_left(global_step)
        probes_s = left / max(self.every, 1) * self.probe_batches * self._grad_s()
        return (self._affordable(once + FULL_STEPS * self._grad_s() + probes_s,
                                 global_step, ratio)
                and once <= OVERHEAD_SHARE * left * self._lowest_step_s(ratio))

    def _refill_s(self, mask):
        """What moving the prefix cache to `mask`'s cut costs: an epoch's steps each running
        the new prefix once more (the forward pass the cut saves), 0 when the cut stays or
        the selection has none."""
        s, model = self.s, self.ctl.model
        if not self.economy or not s.records or model.cut_of(mask) is None:
            return 0.0
        if model.cut_name(mask) == s.records[-1].get("cut"):
            return 0.0
        device = self._t_full_s() / (self.ctl.base.t_full / 1e3)  # this run's device speed
        return self.steps_per_epoch * model.forward_saved(mask) / 1e3 * device

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
            return self.overhead_s + self._pending_compile_s()
        compiles = len({tuple(r["mask"]) for r in s.records if not all(r["mask"])})
        grad_s = self.ctl.base.t_full / 1e3 / self.ctl.base.full_over_grads
        return (compiles * (self._compile_estimate(self.rho) or 0.0)
                + (len(s.full_times) + s.probes_run) * grad_s)

    def _pending_compile_s(self):
        """The open selection's compile, paid by its first step and booked when it closes."""
        s = self.s
        if not (s.record_open and s.times and s.first_compiled and s.first_step_s is not None
                and not all(s.mask)):
            return 0.0
        return max(s.first_step_s - statistics.median(s.times), 0.0)

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
