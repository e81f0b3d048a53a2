"""Closed-loop rho: measure the step-time ratio a run achieves and correct the time model.

Not in the paper.  The paper keeps T(sel) <= rho * t_full with a time model (eq. 3) built once,
offline; it names that model's staleness (other load, throttling) as its weakness.  Here every
elastic run times its own steps: at each re-selection a few full training steps among the
selection's own first steps, and

    measured ratio = median(step time of the selection) / median(full step time)

both taken within the same minutes, so that a device that has slowed down since profiling
slows both alike.  One round (MEASURE_STEPS of the selection's steps, FULL_STEPS full
steps) varies by 4% from round to round on this 2-core machine (scripts/bench_speedup.py,
noise), with outliers when other load comes in bursts, so a miss in one round is only a
suspicion: the loop measures CONFIRM_ROUNDS rounds and acts when the pooled medians still miss.
A selection is measured again in the same way every RECHECK_STEPS of its steps.
A miss is a measured ratio above rho by more than TOLERANCE, or below it while tensors worth
training were left out for lack of budget, or below its own prediction for a selection the
model says cannot reach rho (see judge); then the controller refits the time model to what the
run measured and the loop re-solves eq. 3 with the same importance, at most MAX_CORRECTIONS
times per re-selection.

The correction model.  With the table's (already calibrated) times, a selection costs
    r(sel) = f + s * (DW(sel) + DY(sel)) / t_full,
with f = 1 - s * (DW_all + DY_all) / t_full so that full training is 1 by definition: one
unknown, the scale s of the backward ops, and f, the forward pass plus a fixed per-step cost
that no op carries (dispatch, the optimizer's own work, the input pipeline's share), follows.
The profiler's calibration already splits t_dw from t_dy; a run's few noisy measurements
cannot split them again without swinging (fitting both scales, the t_dy scale went 0.6, 0.3,
0.15 in three corrections of one run here), so the run fits only s: by least squares over the
last HISTORY measurements, pulled toward the current s, and damped (one correction changes s by
at most MAX_FACTOR).  NumPy only; elastic/runtime.py asks for the steps and books their times.
"""
import numpy as np

# TOLERANCE: a miss is |measured / target - 1| above it (defined with the time model, whose
# limited_by uses it too)
from elastictrainer.method.time_model import TOLERANCE, selection_sums

MAX_CORRECTIONS = 3    # per re-selection
# a selection's steps timed (after its first, which may compile) before it is judged
MEASURE_STEPS = 10
FULL_STEPS = 5         # full steps timed per round (medians of 5 and 3 swung by 0.3 here)
# a miss is corrected once the pooled measurement of this many rounds holds it
CONFIRM_ROUNDS = 2
# Once a selection is judged, it is measured again (a new window: rounds as above) after this many
# of its steps: 1% of its steps are then full steps.  Without it a drift after the first
# measurement went unseen: in the smallcnn setting with seed 4 a selection judged at 0.48
# over its first steps had a median step of 0.59 of the full step timed at its start over its
# 600 steps, and the run took 0.62 of full training's time for rho 0.5.
RECHECK_STEPS = 500
BACK_UP = 3            # after an overshoot, under is a miss beyond this many tolerances
MAX_FACTOR = 2.0       # damping: a scale moves by at most this factor per correction
HISTORY = 8            # measurements the fit keeps (older ones may describe another load)
_RIDGE = 1e-3


class RhoController:
    """Holds the run's time model and its corrections.

    `model` is the TimeModel to select with (the table's, corrected); `judge` says whether a
    measured ratio is a miss; `correct` refits after one.  `state()` / `from_state()` carry
    the corrections across a resumed run.
    """

    def __init__(self, base, rho, feedback=True, tolerance=TOLERANCE,
                 max_corrections=MAX_CORRECTIONS):
        self.base = base
        self.rho = float(rho)
        self.feedback = bool(feedback)
        self.tolerance = float(tolerance)
        self.max_corrections = int(max_corrections)
        self.dw_scale = 1.0
        self.dy_scale = 1.0
        self.points = []  # (DW, DY, measured ratio, forward saved by a cached prefix), table ms
        self.model = base

    def judge(self, measured, limited_by, was_over=False, predicted=None):
        """"over", "under" or None.  Over: measured above rho by more than the tolerance.
        Under: measured below rho by more than the tolerance while the budget is what stopped
        the selection ("budget"); or, for a selection the model says cannot reach rho ("depth":
        budget unspent on purpose, time_model.limited_by; "forward floor": nothing is that
        fast; "share", "rate": rho auto's objectives, whose target is its own ratio), below its
        own `predicted` ratio: the model overestimates it, and a corrected one might afford
        more.  Never when every tensor left out scores <= 0 ("importance": done, however
        fast).  Once this re-selection has been over rho (`was_over`), under needs BACK_UP
        times the tolerance:
        going back up on marginal, noisy measurements swung between over and under, and under
        is the side that keeps the promise; but one overshooting correction had left the
        smallcnn setting training 1 tensor of 20 for 4 epochs (the corrected model put
        its forward floor at 0.57 for rho 0.5; the step measured 0.31)."""
        if measured is None:
            return None
        if over_rho(measured, self.rho, self.tolerance):
            return "over"
        if limited_by == "importance":
            return None
        target = self.rho
        if limited_by in ("depth", "forward floor", "share", "rate") and predicted is not None:
            target = predicted
        margin = self.tolerance * (BACK_UP if was_over else 1)
        return "under" if measured < target * (1 - margin) else None

    def decide(self, measured, limited_by, was_over, predicted, rounds, corrections):
        """What to do with a selection measured at `measured` over `rounds` pooled rounds,
        after `corrections` corrections in this re-selection: ("keep", miss) when it holds
        rho (judge), when feedback is off or the corrections are used up; ("confirm", miss)
        to measure another round first, since one round's ratio varies by 4% here and has
        outliers (a burst of other load), so a miss is corrected only if it holds over
        CONFIRM_ROUNDS pooled rounds; ("correct", miss) otherwise.  The one policy, applied by
        ElasticRuntime (which the training loops and scripts/bench_speedup.py drive)."""
        miss = self.judge(measured, limited_by, was_over, predicted=predicted)
        if miss is None or not self.feedback or corrections >= self.max_corrections:
            return "keep", miss
        if rounds < CONFIRM_ROUNDS:
            return "confirm", miss
        return "correct", miss

    def correct(self, mask, measured):
        """Add one measurement (a selection's mask and its measured ratio), refit the scales and
        return the corrected model (also `self.model`)."""
        dw, dy = selection_sums(self.base.t_dw, self.base.t_dy, self.base.rank, mask)
        saved = self.base.forward_saved(mask)
        self.points = (self.points + [(dw, dy, float(measured), saved)])[-HISTORY:]
        a, b = fit_scales(self.base, self.points, (self.dw_scale, self.dy_scale))
        self.dw_scale, self.dy_scale = a, b
        self.model = self.base.corrected(a, b)
        return self.model

    def drop_cache(self):
        """The run's prefix cache is off from now on: select as without one."""
        self.base = self.base.without_cache()
        self.model = self.base.corrected(self.dw_scale, self.dy_scale)

    def state(self):
        return {"dw_scale": self.dw_scale, "dy_scale": self.dy_scale,
                "points": [list(p) for p in self.points]}

    def load_state(self, state):
        self.dw_scale = float(state["dw_scale"])
        self.dy_scale = float(state["dy_scale"])
        self.points = [tuple(p) for p in state["points"]]
        self.model = self.base.corrected(self.dw_scale, self.dy_scale)


def over_rho(measured, rho, tolerance=TOLERANCE):
    """A measured ratio above rho by more than the tolerance: a miss, and no candidate."""
    return measured > rho * (1 + tolerance)


def prefer_measured(mask, importance, measured, rho, tolerance=TOLERANCE):
    """The DP's `mask`, or a selection this run has measured within rho that eq. 3's objective
    (the summed importance) values more: (mask, its measured ratio or None for the DP's own).

    `measured` maps selections (tuples of tensor indices) to the ratio their latest measurement
    window gave.  A measured ratio beats the time model's prediction of it: after a correction
    the one-scale model may put a selection that measured 0.499 for rho 0.5 above rho, and the
    DP would then trade it for a cheaper one worth less.  In the smallcnn setting with
    --lr_schedule cosine that dropped the second stage's BatchNorm tensors for the rest of the
    run (seeds 1 and 2: measured 0.46-0.47, the budget 6% unspent).  Keeping them did not buy
    those seeds' accuracy back: with this function both kept them for most of the run and
    still ended 2.7 and 5.5 points under full training."""
    importance = np.asarray(importance, float)
    mask = np.asarray(mask, bool)
    best, best_ratio = mask, None
    gain = float(importance[mask].sum())
    for selection, ratio in measured.items():
        if over_rho(ratio, rho, tolerance):
            continue
        candidate = np.zeros(len(mask), bool)
        candidate[list(selection)] = True
        value = float(importance[candidate].sum())
        if value > gain + 1e-9 * max(abs(gain), 1e-12):
            best, best_ratio, gain = candidate, float(ratio), value
    return best, best_ratio


def fit_scales(base, points, current):
    """Scales (a, b) of t_dw and t_dy, both the one backward scale s of the module doc that
    best explains `points` [(DW, DY, ratio[, forward saved])], ridge-pulled toward `current`
    and damped by MAX_FACTOR.  A step of a cached prefix leaves out part of the forward pass
    as well (TimeModel.forward_saved), which the fit takes off its 1 - r."""
    backward_all = float(np.sum(base.t_dw) + np.sum(base.t_dy))
    s0 = float(np.sqrt(current[0] * current[1]))
    # 1 - r = s * u, one row per point: u is the backward work the selection leaves out
    u = np.array([(backward_all - p[0] - p[1]) / base.t_full for p in points])
    y = np.array([1.0 - p[2] - (p[3] if len(p) > 3 else 0.0) / base.t_full for p in points])
    lam = _RIDGE * float(np.mean(u * u)) + 1e-12
    s = float((u @ y + lam * s0) / (u @ u + lam))
    s = float(np.clip(s, s0 / MAX_FACTOR, s0 * MAX_FACTOR))
    s = min(s, base.t_full / backward_all)  # f < 0: a step faster than no forward pass at all
    return s, s
