"""What an elastic run may spend on re-selecting (--economy): the rules that keep the
runtime's overhead in proportion to the run, and a short run no slower than full training.

An elastic run's batches cost what full training's cost, except its selections' steps, which
save (1 - ratio) of a full step each: probes and timed full steps compute every gradient and
train nothing, about a full step.  Against that saving it pays for compiling each selection's
step.

The compile it prices is known before the first step (the timing table's compile_ms, else an
estimate from the model's size), so the run decides the same way at its start whatever its
table holds; with the feedback on, the run's own last compile prices the later switches.  Every
price, in seconds, is prices.py's.

- At the start: a run whose steps, all at rho, would save less than PAYOFF times that compile
  trains every tensor from its first step with full training's step, and never probes: it is
  full training, neither slower nor heavier in memory, and says so at the start, in its
  closing line and in summary.json ("economy").  Once probed, the selection is the cheaper
  way on (its graph is part of the full step's, so it compiles faster than the full step
  would).
- Later spending is held to a budget: a re-selection's probes, the full steps that measure a
  selection (and re-check it), and a switch to a selection not compiled yet happen only while
  the run's re-selection overhead, that spending included, stays within PLANNED_SHARE of its
  training time.  What the budget leaves out is skipped: the selection is kept, or trained
  without the closed loop's measurement, and the run says so.  Except for a selection whose
  training loss did not fall over its interval (trend.py): it is re-probed and replaced
  whatever the budget says, unless the probes choose it again or the steps left are too few
  to pay for re-selecting (its probes, compile and refill above OVERHEAD_SHARE of the time
  those steps take); each such decision is one line saying why.
- A switch to a cheaper selection that saves PAYOFF times its compile, refill and measurement
  over the steps left shortens the run: the budget lets it through (docs/performance.md).
- A selection the budget does not let the closed loop measure still has its step ratio read
  out: READOUT_FULL_STEPS timed full steps interleaved with its first steps (the gradient step
  they run is the probe's, compiled already), when they cost at most READOUT_SHARE of the
  run's training time.  Nothing is corrected on it; the run reports it.  Otherwise the run says
  why it has no measured ratio and gives the time model's instead.
- With the frozen prefix cached (--cache_frozen_prefix), a switch that moves the cut fills the
  cache again (prices.refill_s).  It is priced with the switch's compile, so a selection that
  breaks the cache must fit the same budget.

Economy is a component of the runtime (runtime.py): it is built with the run's fixed inputs and
asked with the run's progress so far (Progress), a snapshot the runtime takes.
"""
import dataclasses
from typing import Callable, Optional

import numpy as np

from elastictrainer.elastic.prices import Prices
from elastictrainer.elastic.rho_control import FULL_STEPS

# A switch away from full steps must save this multiple of its compile; below it the run keeps
# full steps (a compile estimate may be off by a third).
PAYOFF = 1.5
# The re-selection overhead a run may reach with later switches to uncompiled selections, as a
# share of its training time (and a compile's share of the steps left).
OVERHEAD_SHARE = 0.10
# Later switches plan for this much of it: a compile estimated from the last one came out up to
# a third low here (the first compile of a process pays TensorFlow's warm-up).
PLANNED_SHARE = 0.8 * OVERHEAD_SHARE
# A selection the budget leaves unmeasured has its ratio read out from this many timed full
# steps (a median of three outlasts one outlier), when they cost at most READOUT_SHARE of the
# run's training time.
READOUT_FULL_STEPS = 3
READOUT_SHARE = 0.02

# How a command-line user turns the economy off (another driver names its own: off_words)
ECONOMY_OFF = "--economy false"
FULL_TRAINING = "full training"
SELECTIONS = "selections"


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the run has done so far, as the economy weighs it (ElasticRuntime takes it).
    full_step_s: the median timed full step (None before any); overhead_s: re-selection
    overhead booked, the open selection's compile included; full_steps, probes: timed full and
    probe steps run; selections_compiled: partial selections trained; selection_compile_s: the
    latest selection step's compile; current_ratio: the current selection's measured, else
    predicted, step ratio, and current_cut its prefix cache cut (None before any selection, or
    none); selected: whether a selection was made (probes ran)."""
    full_step_s: Optional[float] = None
    overhead_s: float = 0.0
    full_steps: int = 0
    probes: int = 0
    selections_compiled: int = 0
    selection_compile_s: Optional[float] = None
    current_ratio: Optional[float] = None
    current_cut: Optional[str] = None
    selected: bool = False


class Economy:
    """The economy of one run.  prices: the run's Prices (--economy on or off, its controller:
    the RhoController with the time model, the table's base model, rho and feedback; the run's
    total and per-epoch steps, its probe batches and compile); every: steps between
    re-selections; is_compiled(selection): whether a selection's step exists already; auto:
    --rho auto (the controller's rho is then Budget.auto_start until the first
    selection, and each selection's own ratio after it); off_words: how the run's user turns
    the economy off, in its lines ("economy=False" in model.fit); log(message)."""

    def __init__(self, prices: Prices, *, every, is_compiled: Callable = lambda selection: False,
                 auto=False, off_words=ECONOMY_OFF, log=print):
        self.prices = prices
        self.on = prices.on
        self.ctl = prices.ctl
        self.auto = bool(auto)
        self.every = every
        self.is_compiled = is_compiled
        self.off_words = off_words
        self.log = log
        # what it chose and why (summary.json "economy"), and what it said once
        self._choice = {}
        self._notes = {}

    @property
    def total_steps(self):
        return self.prices.total_steps

    @property
    def probe_batches(self):
        return self.prices.probe_batches

    @property
    def n(self):
        return self.prices.n

    @property
    def rho(self):
        return self.ctl.rho

    def rho_words(self, started=True):
        """The rho a saving is priced at, in words: "rho 0.5"; under --rho auto, its estimate
        before the first selection (no importance yet: started=False) and the current
        selection's ratio after it."""
        if not self.auto:
            return f"rho {self.rho:g}"
        if not started:
            return f"rho auto's start estimate ({self.rho:.2f}, every tensor alike in importance)"
        return f"rho auto's current {self.rho:.2f}"

    # ------------------------------------------------------------------ the start
    def settles_at_start(self):
        """Whether the run, at its start, cannot pay for one selection's compile (module doc):
        it then trains every tensor throughout and never probes.  Said in one line when it
        matters; the choice is kept for record()."""
        choice, why, short = self._start()
        self._choose(choice, why)
        if choice == FULL_TRAINING:
            self.log(f"elastic: {why}: training all tensors with full training's step, no "
                     f"re-selection ({self.off_words} to select anyway)")
        elif short:
            self._note("short", "re-selecting held to its overhead share", short)
        return choice == FULL_TRAINING

    def start_choice(self):
        """What the start chooses (FULL_TRAINING or SELECTIONS), saying nothing."""
        return self._start()[0]

    def _start(self):
        """(choice, why, a warning line or None) at the run's start, saying nothing."""
        if not self.on:
            return (SELECTIONS, f"{self.off_words}: re-selects and corrects as the paper "
                                "does, whatever the run's length", None)
        compile_s = self.prices.start_compile_s()
        saving = self.prices.best_saving_s(0, Progress())
        if saving < PAYOFF * compile_s:
            return (FULL_TRAINING, f"the {self.total_steps} steps would save about "
                                   f"{saving:.2f} s at {self.rho_words(False)}, not "
                                   f"{PAYOFF:g}x the {compile_s:.2f} s that compiling a "
                                   f"selection's step costs ({self.prices.compile_source()})", None)
        why = (f"the {self.total_steps} steps save about {saving:.2f} s at "
               f"{self.rho_words(False)}, at least {PAYOFF:g}x the {compile_s:.2f} s that "
               f"compiling a selection's step costs ({self.prices.compile_source()})")
        short = None
        if compile_s / OVERHEAD_SHARE > saving:
            short = (f"short run: {self.total_steps} steps save about {saving:.1f} s at "
                     f"{self.rho_words(False)}, and compiling a selection's step costs about "
                     f"{compile_s:.1f} s; re-selections, measurements and corrections are "
                     f"budgeted at {OVERHEAD_SHARE:.0%} of training on that estimate (the "
                     f"closing line gives what they took)")
        return SELECTIONS, why, short

    # ------------------------------------------------------------------ switches
    def pays_off(self, mask, global_step, progress):
        """Whether leaving full steps for `mask` saves more than its compile costs.  After a
        probe, the full step is one more compile too unless it exists already, and a larger one
        than a selection's: the selection pays then."""
        if (not self.on or mask.all()
                or not self.is_compiled(tuple(range(self.n)))
                or self.is_compiled(tuple(int(k) for k in np.nonzero(mask)[0]))):
            return True
        ratio = self.ctl.model.predicted_ratio(mask)
        compile_s = self.prices.compile_estimate(progress)
        saving = self.prices.saving_left_s(ratio, global_step, progress)
        if saving >= PAYOFF * compile_s:
            return True
        why = (f"the {self.prices.steps_left(global_step)} steps left from step {global_step} "
               f"would save about {saving:.2f} s, not {PAYOFF:g}x the {compile_s:.2f} s that "
               f"compiling a selection's step is estimated to cost")
        if "full" not in self._notes:
            self._choose(FULL_TRAINING, why)
            self._note("full", f"every tensor trained from step {global_step}",
                       f"elastic: {why}: training all tensors, as full training would "
                       f"({self.off_words} to select anyway)")
        return False

    def worth_compiling(self, selection, global_step, progress):
        """Whether a later switch (a re-selection or a correction) to `selection` may compile
        its step and, when it moves the prefix cache's cut, fill the cache again (refill_s):
        the overhead so far, these, the full steps that will measure it and the probes of the
        re-selections still to come must fit the budget (affordable); and the compile and
        refill within OVERHEAD_SHARE of the time the steps left will take."""
        mask = np.zeros(self.n, bool)
        mask[list(selection)] = True
        compile_s = self.prices.compile_estimate(progress)
        if compile_s is None or self.is_compiled(tuple(selection)):
            compile_s = 0.0
        once = compile_s + self.prices.refill_s(mask, progress)
        if once == 0:
            return True
        ratio = self.ctl.model.predicted_ratio(mask)
        measure_s = FULL_STEPS * self.prices.grad_s(progress)
        if self._pays_for_itself(ratio, once + measure_s, global_step, progress):
            return True
        left = self.prices.steps_left(global_step)
        probes_s = left / max(self.every, 1) * self.probe_batches * self.prices.grad_s(progress)
        return (self.affordable(once + measure_s + probes_s, global_step, progress, ratio)
                and once <= OVERHEAD_SHARE * left * self.prices.lowest_step_s(progress, ratio))

    def _pays_for_itself(self, ratio, cost_s, global_step, progress):
        """Whether switching from the current selection to one of step ratio `ratio` saves,
        over the steps left, PAYOFF times its cost (`cost_s`: compile, refill and the full
        steps that measure it): no overhead, but the run's saving."""
        current = progress.current_ratio
        if current is None or ratio >= current:
            return False
        gain = (self.prices.saving_left_s(ratio, global_step, progress)
                - self.prices.saving_left_s(current, global_step, progress))
        return gain >= PAYOFF * cost_s

    # ------------------------------------------------------------------ the budget
    def affordable(self, extra_s, global_step, progress, step_ratio=None):
        """Whether spending `extra_s` more on re-selecting fits both budgets: the run's
        overhead within PLANNED_SHARE of its training time, taken as its steps at the lowest
        step ratio in sight (rho, the current selection's, `step_ratio`: loop work would only
        add to it); and within 1 / PAYOFF of what the run saves at best, so that it stays
        faster than full training.  A short run whose first compile alone takes the share
        spends nothing more: no later probe, measurement or compile."""
        if not self.on:
            return True
        spent = self.prices.spent_s(progress) + extra_s
        share = PLANNED_SHARE * self.total_steps * self.prices.lowest_step_s(progress, step_ratio)
        return spent <= share and spent <= self.prices.best_saving_s(0, progress) / PAYOFF

    def probes_affordable(self, global_step, progress, stalled=None):
        """Whether this re-selection's probes fit the budget (a skipped one keeps the selection
        until the next); stalled: words on the current selection's loss that did not fall, which
        re-probes past the budget (replaces)."""
        if not progress.selected:
            return True  # the first selection: the start decided the run selects
        ok = self.affordable(self.probe_batches * self.prices.grad_s(progress), global_step,
                             progress)
        if not ok and stalled:
            return self.replaces(global_step, progress, stalled)
        if not ok:
            self._note("probes", f"re-selections from step {global_step} on skipped",
                       f"elastic: re-selections from step {global_step} on are skipped: their "
                       f"probes would take the re-selection overhead past {OVERHEAD_SHARE:.0%} "
                       f"of training (the selection is kept)")
        return ok

    def same_again(self, global_step, stalled):
        """A selection whose loss did not fall, chosen again by this re-selection's probes."""
        self.log(f"elastic: step {global_step}: {stalled}, but the probes choose the same "
                 f"tensors again: the selection is kept")

    def recheck_affordable(self, global_step, progress):
        """Whether the closed loop may measure a judged selection again."""
        return self.affordable(FULL_STEPS * self.prices.grad_s(progress), global_step, progress)

    def measurement(self, global_step, mask, progress):
        """How a new selection `mask` is measured: "full" (the closed loop's rounds of
        FULL_STEPS timed full steps, its compile included in the price if not compiled yet),
        "readout" (READOUT_FULL_STEPS of them, read out and not acted on: module doc) or None
        (unmeasured, said once)."""
        selection = tuple(int(k) for k in np.nonzero(mask)[0])
        ratio = self.ctl.model.predicted_ratio(mask)
        compile_s = 0.0
        if not self.is_compiled(selection):
            compile_s = self.prices.compile_estimate(progress) or 0.0
        if self.affordable(FULL_STEPS * self.prices.grad_s(progress) + compile_s, global_step,
                           progress, ratio):
            return "full"
        readout_s = READOUT_FULL_STEPS * self.prices.grad_s(progress)
        fits = (readout_s
                <= READOUT_SHARE * self.total_steps * self.prices.lowest_step_s(progress, ratio))
        pays = (self.prices.spent_s(progress) + compile_s + readout_s
                <= self.prices.best_saving_s(0, progress) / PAYOFF)
        # the gradient step they run exists once a probe or a timed full step has run
        if fits and pays and (progress.probes or progress.full_steps):
            self._note("readout", f"selections from step {global_step} on timed against "
                                  f"{READOUT_FULL_STEPS} full steps only (not corrected)",
                       f"elastic: selections from step {global_step} on are not corrected: the "
                       f"closed loop's full steps would take the re-selection overhead past "
                       f"{OVERHEAD_SHARE:.0%} of training; {READOUT_FULL_STEPS} timed full "
                       f"steps read their step ratio out")
            return "readout"
        self._note("measure", f"selections from step {global_step} on unmeasured: timing "
                              f"full steps beside them would cost more than "
                              f"{READOUT_SHARE:.0%} of training",
                   f"elastic: selections from step {global_step} on train on the time "
                   f"model's word, unmeasured: timing full steps beside them would take the "
                   f"re-selection overhead past {OVERHEAD_SHARE:.0%} of training")
        return None

    def replaces(self, global_step, progress, stalled, selection=None):
        """Whether a selection whose loss did not fall (`stalled`, its words) is re-probed
        (selection None) or replaced by `selection` past the budget: unless the steps left are
        too few to pay for it (module doc).  Says which, and why, in one line."""
        compile_s = self.prices.compile_estimate(progress) or 0.0
        refill_s, probes_s, ratio = 0.0, 0.0, None
        if selection is None:
            probes_s = self.probe_batches * self.prices.grad_s(progress)
            what = "re-probed"
        else:
            mask = np.zeros(self.n, bool)
            mask[list(selection)] = True
            compile_s *= not self.is_compiled(tuple(selection))
            refill_s = self.prices.refill_s(mask, progress)
            ratio = self.ctl.model.predicted_ratio(mask)
            what = f"replaced by {len(selection)} tensor{'s' * (len(selection) != 1)}"
        cost = probes_s + compile_s + refill_s
        left = self.prices.steps_left(global_step)
        room = OVERHEAD_SHARE * left * self.prices.lowest_step_s(progress, ratio)
        if cost <= room:
            self.log(f"elastic: step {global_step}: {stalled}: the selection is {what} past the "
                     f"overhead budget")
            return True
        self.log(f"elastic: step {global_step}: {stalled}, but the selection is kept: the "
                 f"{left} steps left are too few to pay for re-selecting ({cost:.2f} s, more than "
                 f"{OVERHEAD_SHARE:.0%} of the {room / OVERHEAD_SHARE:.1f} s they take)")
        return False

    def kept(self, global_step, corrected=None, why=None):
        """A switch the budget did not pay for: the selection is kept.  corrected: (tensors,
        measured ratio) when the switch was the closed loop's correction; why: a re-selection's
        words on the kept selection's loss; each said."""
        self._note("kept", f"switches from step {global_step} on kept to compiled selections",
                   None)
        if not corrected:
            why = why or "its training loss was not judged (too few steps, or none reported)"
            self.log(f"elastic: step {global_step}: the selection is kept: compiling another "
                     f"would take the re-selection overhead past {OVERHEAD_SHARE:.0%} of "
                     f"training, and {why}")
        if corrected:
            self.log(f"rho feedback: {corrected[0]} tensors measured {corrected[1]:.3f} of a "
                     f"full step for {self.rho_words()}; the "
                     f"{self.prices.steps_left(global_step)} steps left do not pay for compiling "
                     f"another selection (overhead budget "
                     f"{OVERHEAD_SHARE:.0%} of training), kept")

    # ------------------------------------------------------------------ what it chose
    def _choose(self, choice, why):
        self._choice = {"choice": choice, "why": why}

    def _note(self, what, short, line):
        """Remember `short` for the record and say `line` (if any) once."""
        if what in self._notes:
            return
        self._notes[what] = short
        if line:
            self.log(line)

    def noted(self, what):
        return what in self._notes

    def record(self):
        """summary.json's "economy": on, what it chose (full training or selections) and why,
        the compile it priced and where that came from, and what it held back."""
        choice = self._choice or dict(zip(("choice", "why"), self._start()[:2]))
        return {"on": self.on, **choice,
                "compile_s": self.prices.start_compile_s() if self.on else None,
                "compile_from": self.prices.compile_source() if self.on else None,
                "held_back": [v for k, v in self._notes.items() if k != "full"]}

    def closing(self):
        """The closing line's words on the economy: '' when it held nothing back."""
        if self._choice.get("choice") == FULL_TRAINING:
            return (f"every tensor trained, as in full training: {self._choice['why']} "
                    f"({self.off_words} to select anyway)")
        held = [v for k, v in self._notes.items() if k not in ("full", "measure")]
        return "economy: " + ", ".join(held) if held else ""

    def unmeasured_why(self):
        """Why selections went unmeasured (measurement), None if none did."""
        return self._notes.get("measure")

    def state(self):
        return {"choice": dict(self._choice), "notes": dict(self._notes)}

    def load_state(self, state):
        self._choice = dict(state.get("choice") or {})
        self._notes = dict(state.get("notes") or {})
