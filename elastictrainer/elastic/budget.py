"""What each selection may cost: a step-time ratio rho the user asked for (eq. 3, the paper's),
or `--rho auto` (not in the paper), where each re-selection solves one of two objectives and
the ratio its selection amounts to becomes the closed loop's target until the next one.  A
numeric rho may take a tolerance (--rho_tolerance): the cheapest selection within that share of
eq. 3's best importance when it saves as large a share of the step, a tie-break toward cheaper
selections (off by default).  The auto objectives:

- share (--rho_objective share): the cheapest selection that keeps a share of the estimated
  loss drop (method/cheapest.py, the dual of eq. 3, solved as exactly);
- rate (--rho_objective rate): the selection with the most estimated loss drop per second of
  step, its importance over its predicted step time (method/rate.py, exact by Dinkelbach's
  method);
- gain (--rho_objective gain): the selection whose estimated loss drop most exceeds what full
  training's rate (every tensor's importance over a full step) would bring in its step time:
  a tensor joins when it brings loss drop at least as fast as full training does on average
  (method/rate.py, exact).  It trains at least the rate's tensors and at most every tensor.

Why: rho is a guess the user has to make.  Too high spends time on tensors that bring little;
too low leaves out tensors that matter (a short, small-image run at rho 0.5 ended 5.9 points
under full training).  The share asks instead how much of what training every tensor would
bring a run keeps, which the importance estimate (eq. 4-6) answers at every re-selection, so
the budget follows the run: large while much is to gain deep in the model, small once the head
alone carries the loss drop.  The share keeps that part whatever each tensor costs; the rate
weighs each tensor's importance against its cost and needs no share.  Each auto selection
says why it is what it is (Choice): the share of the loss drop it keeps, its predicted ratio,
and the best selection of another deepest tensor.

An auto run whose selection did not lower the training loss over its interval while that loss is
still high (trend.failing) widens: from then on a selection that the objective would make
cheaper than that one's predicted step ratio plus WIDEN of what it saved is replaced by eq. 3's
under that ratio (a floor, Budget.widened; the runtime keeps it in its checkpointed state).  The
estimate chose the selection that failed, so the run moves towards full training rather than to
another guess of the same size; a step budget, not a share of the estimate, since an estimate
dominated by the failed tensors would widen a share by next to nothing.  When the widened ratio
buys no tensor beyond the failed selection's, every tensor trains from then on (full training's
step).  A numeric rho is the user's budget and does not widen.  Plain Python.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from elastictrainer import runlog

AUTO = "auto"
# --rho_share's default: the share that came within 1 point of full training's best on every
# configuration of the time-to-accuracy benchmark that has a yardstick (the smallcnn setting at
# 64 px over five seeds, smallcnn at 32 px, a pretrained Keras 3 CNN in model.fit); 0.5 was
# faster at 64 px but ended 2.9 points under at 32 px (docs/performance.md)
DEFAULT_SHARE = 0.7
# Under auto, a selection whose training loss did not fall (elastic/trend.py) widens every later
# one: each may spend this part of the step time it saved, on top of its own (Budget.widened).
# Half: after two failures a quarter is saved, and the run approaches full training, which
# lowers the loss wherever any selection can, at most a few intervals later.
WIDEN = 0.5
SHARE, RATE, GAIN = "share", "rate", "gain"
# --rho_objective's choices, in its help's words
OBJECTIVES = {
    SHARE: "the cheapest selection that keeps --rho_share of the estimated loss drop",
    RATE: "the selection with the most estimated loss drop per second of step (its importance "
          "over its predicted step time: each tensor's importance weighed against its cost; "
          "--rho_share is not used)",
    GAIN: "the selection whose estimated loss drop most exceeds what full training's rate "
          "would bring in its step time (a tensor joins when it lowers the loss at least as "
          "fast per second as training every tensor does; --rho_share is not used)"}
DEFAULT_OBJECTIVE = SHARE


# --head_warmup's auto: under --rho auto the head trains alone for this share of the first
# interval before the first probes (runtime.py); a numeric rho probes at the first step, as the
# paper does, so that its runs (and the figures' protocol) stay the paper's
AUTO_HEAD_WARMUP = 0.1


def head_warmup_share(setting, rho):
    """The head warm-up's share of the first interval: `setting` (a number in [0, 1), or
    "auto": AUTO_HEAD_WARMUP under rho auto, 0 with a numeric rho)."""
    if isinstance(setting, str) and setting.strip().lower() == AUTO:
        return AUTO_HEAD_WARMUP if parse_rho(rho) == AUTO else 0.0
    return float(setting)


def parse_rho(value):
    """A rho setting: a number, or "auto" (any case)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return float(value)


class Budget:
    """rho: the requested step-time ratio, or AUTO; share: with AUTO and the share objective,
    the share of the positive importance (the estimated loss drop) each selection keeps;
    objective: AUTO's objective, SHARE, RATE or GAIN (module docstring); tolerance: with a
    numeric rho, the share of eq. 3's best importance a cheaper selection may give up
    (TimeModel.select; 0: eq. 3's answer, the paper's)."""

    def __init__(self, rho, share=DEFAULT_SHARE, objective=DEFAULT_OBJECTIVE, tolerance=0.0):
        self.auto = parse_rho(rho) == AUTO
        self.share = float(share)
        if self.auto and not 0 < self.share <= 1:
            raise ValueError(f"the share of rho auto must be in (0, 1], got {share}")
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown rho auto objective {objective!r}; valid: "
                             f"{', '.join(OBJECTIVES)}")
        self.objective = objective
        self.rho = None if self.auto else float(rho)
        self.tolerance = float(tolerance)
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"the tolerance of a numeric rho must be in [0, 1), got {tolerance}")

    @property
    def text(self):
        """The budget in a line: "0.5", "auto (90% of the estimated loss drop)", or "auto
        (the most estimated loss drop per second of step)"."""
        if not self.auto:
            return f"{self.rho:g}" + (
                f" (giving up at most {self.tolerance:.0%} of eq. 3's estimated loss drop for "
                f"at least {self.tolerance:.0%} of the step)" if self.tolerance else "")
        if self.objective == RATE:
            return f"{AUTO} (the most estimated loss drop per second of step)"
        if self.objective == GAIN:
            return f"{AUTO} (the most estimated loss drop beyond full training's rate)"
        return f"{AUTO} ({self.share:.0%} of the estimated loss drop)"

    def solve(self, model, importance, resolution, floor=0.0):
        """(mask, the ratio it is solved for): eq. 3 under rho, or the auto objective's
        selection, whose predicted ratio is then the target.  floor: under auto, the step
        ratio a cheaper selection is widened to (widened, below)."""
        if not self.auto:
            return model.select(importance, self.rho, resolution=resolution,
                                tolerance=self.tolerance), self.rho
        mask = self._select(model, np.asarray(importance, float), resolution, floor=floor)
        return mask, model.predicted_ratio(mask)

    def auto_start(self, model, resolution):
        """rho auto's ratio before its first selection, when no importance is known yet: the
        cheapest selection keeping the share with every tensor alike in importance.  Not the
        forward floor, the most a selection could save: the first selections of the
        time-to-accuracy benchmark's auto runs (share 0.7) came out at 0.42-0.81 of a full
        step, against floors of 0.00-0.06; priced at its floor, a short run would select, then
        save too little to pay for its probes and compiles."""
        return self.solve(model, np.ones(len(model.t_dw)), resolution)[1]

    def _select(self, model, importance, resolution, not_deepest=None, floor=0.0):
        if floor >= 1:  # full training's step: no objective to solve
            return np.ones(len(importance), bool)
        if self.objective == RATE:
            mask = model.select_rate(importance, not_deepest=not_deepest)
        elif self.objective == GAIN:
            mask = model.select_gain(importance, not_deepest=not_deepest)
        else:
            mask = model.select_share(importance, self.share, resolution=resolution,
                                      not_deepest=not_deepest)
        if floor > 0 and mask is not None and model.predicted_ratio(mask) < floor:
            # eq. 3 under the floor: the most estimated loss drop that step time buys
            return model.select(importance, floor, resolution=resolution)
        return mask

    def widened(self, model, mask, floor):
        """The step ratio auto selections are widened to once selection `mask` did not lower
        the training loss: its predicted ratio plus WIDEN of what it saved of a full step, so
        that repeated failures approach full training, or from `floor` (the floor so far) when
        that is wider.  A floor of 1 trains every tensor.  Auto only: a numeric rho is the
        user's budget."""
        ratio = max(floor, float(model.predicted_ratio(np.asarray(mask, bool))))
        return ratio + WIDEN * (1.0 - ratio)

    def explain(self, model, importance, mask, resolution, floor=0.0):
        """Why an auto selection `mask` is what it is (Choice): its share of the positive
        importance, its predicted ratio, and the objective's best selection whose deepest
        tensor is another (of positive importance): for the share the cheapest keeping it,
        for the rate the one of the best rate, for the gain the one of the largest gain.
        None under a numeric rho or without positive importance."""
        importance = np.asarray(importance, float)
        mask = np.asarray(mask, bool)
        total = float(importance[importance > 0].sum())
        if not self.auto or total <= 0 or not mask.any():
            return None
        other = self._select(model, importance, resolution, model.deepest(mask))

        def described(m):
            return Selected(tensors=int(m.sum()), deepest=model.deepest(m),
                            importance_share=float(importance[m].sum()) / total,
                            predicted_ratio=float(model.predicted_ratio(m)))
        return Choice(self.objective, self.share, described(mask),
                      None if other is None or not other.any() else described(other),
                      floor=floor)

    def fallback(self, cheapest, importance, previous, n, log):
        """What trains when the solution is empty: the previous selection when no tensor has
        positive importance, else the output-most (cheapest) tensor, `cheapest`; said in one
        line."""
        mask = np.zeros(n, bool)
        if not np.any(importance > 0) and previous is not None:
            mask[list(previous)] = True
            log(f"no tensor has positive importance; keeping the previous selection "
                f"({len(previous)} tensors)")
            return mask
        mask[list(cheapest)] = True
        log("no tensor has positive importance; training the output-most tensor only"
            if not np.any(importance > 0) else
            f"no tensor worth training fits rho {self.text} under this time model; training "
            f"the output-most (cheapest) tensor only")
        return mask


@dataclass(frozen=True)
class Selected:
    """A selection as an auto choice describes it: how many tensors, its deepest (trainable
    index), its share of the positive importance (the estimated loss drop it keeps) and its
    predicted step-time ratio; `rate`: the one over the other, the share of the loss drop per
    full step's time (what the rate objective maximises)."""
    tensors: int
    deepest: int
    importance_share: float
    predicted_ratio: float

    @property
    def rate(self):
        return self.importance_share / self.predicted_ratio if self.predicted_ratio > 0 else None

    def to_dict(self):
        return {"tensors": self.tensors, "deepest": self.deepest,
                "importance_share": self.importance_share,
                "predicted_ratio": self.predicted_ratio, "rate": self.rate}


@dataclass(frozen=True)
class Choice:
    """Why an auto selection is what it is (Budget.explain): the objective, the share asked
    (share objective), the selection and the runner-up (the objective's best of another
    deepest tensor; None when there is none)."""
    objective: str
    share: float
    chosen: Selected
    runner_up: Optional[Selected]
    floor: float = 0.0  # the step ratio cheaper selections are widened to (Budget.widened)

    def record_fields(self):
        """The selection record's fields on it (summary.json's selections)."""
        return {"objective": self.objective, "importance_share": self.chosen.importance_share,
                "rate": self.chosen.rate,
                "runner_up": None if self.runner_up is None else self.runner_up.to_dict()}

    def events(self):
        """Its TensorBoard points [(tag, value)] (runlog's tags)."""
        points = [(runlog.SELECTION_IMPORTANCE_SHARE, self.chosen.importance_share)]
        if self.runner_up is not None:
            points += [(runlog.RUNNER_UP_RATIO, self.runner_up.predicted_ratio),
                       (runlog.RUNNER_UP_IMPORTANCE_SHARE, self.runner_up.importance_share)]
        return points

    def line(self, num_tensors):
        """The choice in one line."""
        c, r = self.chosen, self.runner_up
        rate = "" if c.rate is None else f", {c.rate:.2f} of it per full step's time"
        head = (f"rho auto ({self.objective}"
                + (f" {self.share:.0%}" if self.objective == SHARE else "")
                + (f", widened to {self.floor:.3f} of a full step" if self.floor > 0 else "")
                + f"): {c.tensors} of {num_tensors} tensors, deepest #{c.deepest} (of "
                  f"the trainable tensors, 0 at the input), keep "
                  f"{c.importance_share:.0%} of the estimated loss drop at "
                  f"{c.predicted_ratio:.3f} of a full step{rate}")
        best = {SHARE: "the cheapest keeping the share", RATE: "the best rate",
                GAIN: "the largest gain"}[self.objective]
        if r is None:
            return head + ("; no selection with another deepest tensor keeps the share"
                           if self.objective == SHARE else
                           "; no other tensor of positive importance can be the deepest")
        other = "" if r.rate is None else f", {r.rate:.2f}"
        return (f"{head}; {best} with another deepest tensor (#{r.deepest}, {r.tensors} "
                f"tensors): {r.importance_share:.0%} at {r.predicted_ratio:.3f}{other}")
