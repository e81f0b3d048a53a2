"""Closed-loop rho: measure the step-time ratio a run achieves and correct the time model.

Not in the paper.  The paper keeps T(sel) <= rho * t_full with a time model (eq. 3) built once,
offline; it names that model's staleness (other load, throttling) as its weakness.  Here every
elastic run times its own steps: at each re-selection a few full steps (weights and optimizer
state restored afterwards), then the selection's own steps, and

    measured ratio = median(step time of the selection) / median(full step time)

both taken within the same minutes, so that a device that has slowed down since profiling
slows both alike.  When a selection misses rho by more than TOLERANCE (above it; or below it
while tensors worth training were left out for lack of budget) the controller refits the time
model to what the run measured and the loop re-solves eq. 3 with the same importance, at most
MAX_CORRECTIONS times per re-selection.

The correction model.  With the table's (already calibrated) times, a selection costs
    r(sel) = f + a * DW(sel) / t_full + b * DY(sel) / t_full,
with f = 1 - (a * DW_all + b * DY_all) / t_full so that full training is 1 by definition:
two unknowns, the scales a (of t_dw) and b (of t_dy); f, the forward pass plus any fixed
per-step cost, follows.  Each measured selection is one linear equation in (a, b); the fit is
ridge least squares over the last HISTORY measurements, pulled toward the current scales (with
one measurement this is the smallest change that explains it), and damped: one correction
changes a scale by at most MAX_FACTOR.  NumPy only; the loop (loop.py) does the timing.
"""
import numpy as np

from elastictrainer.time_model import selection_sums

TOLERANCE = 0.05       # a miss is |measured / rho - 1| above this
MAX_CORRECTIONS = 3    # per re-selection
MEASURE_STEPS = 5      # a selection's steps timed (after its first, which may compile) before it is judged
FULL_STEPS = 3         # full steps timed at each re-selection
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
        self.points = []  # (DW, DY, measured ratio), table ms
        self.model = base

    def judge(self, measured, limited_by):
        """"over", "under" or None.  Under rho is only a miss when the budget was what stopped
        the selection: a selection of every tensor worth training is done, however fast."""
        if measured is None:
            return None
        if measured > self.rho * (1 + self.tolerance):
            return "over"
        if measured < self.rho * (1 - self.tolerance) and limited_by == "budget":
            return "under"
        return None

    def correct(self, mask, measured):
        """Add one measurement (a selection's mask and its measured ratio), refit the scales and
        return the corrected model (also `self.model`)."""
        dw, dy = selection_sums(self.base.t_dw, self.base.t_dy, self.base.rank, mask)
        self.points = (self.points + [(dw, dy, float(measured))])[-HISTORY:]
        a, b = fit_scales(self.base, self.points, (self.dw_scale, self.dy_scale))
        self.dw_scale, self.dy_scale = a, b
        self.model = self.base.corrected(a, b)
        return self.model

    def state(self):
        return {"dw_scale": self.dw_scale, "dy_scale": self.dy_scale,
                "points": [list(p) for p in self.points]}

    def load_state(self, state):
        self.dw_scale = float(state["dw_scale"])
        self.dy_scale = float(state["dy_scale"])
        self.points = [tuple(p) for p in state["points"]]
        self.model = self.base.corrected(self.dw_scale, self.dy_scale)


def fit_scales(base, points, current):
    """Scales (a, b) of t_dw and t_dy that best explain `points` [(DW, DY, ratio)] under the
    module doc's model, ridge-pulled toward `current` and damped by MAX_FACTOR."""
    dw_all, dy_all = float(np.sum(base.t_dw)), float(np.sum(base.t_dy))
    t_full = base.t_full
    a0, b0 = current
    # 1 - r = a * u + b * v, one row per point
    u = np.array([(dw_all - dw) / t_full for dw, _, _ in points])
    v = np.array([(dy_all - dy) / t_full for _, dy, _ in points])
    y = np.array([1.0 - r for _, _, r in points])
    lam = _RIDGE * float(np.mean(u * u + v * v)) + 1e-12
    lhs = np.array([[u @ u + lam, u @ v], [u @ v, v @ v + lam]])
    rhs = np.array([u @ y + lam * a0, v @ y + lam * b0])
    a, b = np.linalg.solve(lhs, rhs)
    a = float(np.clip(a, a0 / MAX_FACTOR, a0 * MAX_FACTOR))
    b = float(np.clip(b, b0 / MAX_FACTOR, b0 * MAX_FACTOR))
    backward = a * dw_all + b * dy_all
    if backward > t_full:  # f < 0 would mean a step faster than no forward pass at all
        a, b = a * t_full / backward, b * t_full / backward
    return a, b
