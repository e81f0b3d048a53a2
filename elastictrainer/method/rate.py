"""The selection with the most estimated loss drop per second of step (--rho auto with
--rho_objective rate; not in the paper).

Eq. 3 keeps the most importance under a time budget, and the share objective (cheapest.py)
the least time over a floor on importance.  Both take one of the two sides as given.  The rate
takes neither: it asks which selection brings the most estimated loss drop per unit of step
time,

    maximise  R(m) = I(m) / T(m),   I(m) = sum_k m_k * I_k,   T(m) = F + cost(m),

with I_k a tensor's importance (eq. 4-6, the loss drop its training is estimated to bring),
cost(m) eq. 3's cost (selector.eq3_parts: each selected tensor's t_dw, t_dy of every tensor
from the output down to the deepest selected one and, with the frozen prefix cached, the
forward pass above the cut that depth needs), and F > 0 what every step pays whatever it
trains (the time model's intercept: the forward pass of the smallest suffix and the fixed
per-step cost).  T(m) is the selection's predicted step time.

Why: a fixed share keeps a fixed part of the loss drop whatever each tensor costs, so a deep
tensor that brings little joins when the share needs it, however long its error-gradient
chain.  The rate weighs every tensor's importance against its price: a tensor joins exactly
when it brings more loss drop per ms than the selection reaches without it.

Solved exactly by Dinkelbach's method.  For lambda >= 0 let
P(lambda) = max_m I(m) - lambda * T(m); lambda* = max_m R(m) is the one lambda with
P(lambda) = 0.  From lambda_0 = 0, each iteration takes a maximiser m_i of P(lambda_i) and sets
lambda_{i+1} = R(m_i); the lambdas increase strictly until P(lambda_i) = 0, which the finitely
many masks reach in finitely many steps (in practice a handful).  Each P(lambda) is solved
without a knapsack: fixing the deepest selected tensor d fixes the chain and the forward term,
forces m_d = 1, and leaves every tensor above d a choice of its own (take k iff
I_k - lambda * t_dw_k > 0); the best d is then read off prefix sums, O(N) per iteration.  Only
tensors of positive importance can help (dropping one of importance <= 0 never costs more), so
only they are candidates, as the deepest tensor or above it.  Ties go to the cheaper
selection: a tensor whose importance per ms equals the rate is left out (it adds time and no
rate), and of equally good selections the one of least step time (then the shallowest) wins.

The gain objective (--rho_objective gain) stops at the first iterate that counts: it solves
P(lambda_f) once, lambda_f = I(all) / T(all) the rate of training every tensor (full
training's).  Its selection is the one whose estimated loss drop most exceeds what full
training's rate would bring in the same step time: a tensor, or a deeper chain, joins when it
brings loss drop at least as fast per ms as full training does on average.  Its rate is never
below full training's (the full selection scores 0), and its selection never smaller than the
best rate's once the latter's rate is above lambda_f (a larger lambda only drops tensors): it
sits between the rate, which spends the least per unit of loss drop and trains the fewest
tensors, and full training.
"""
from dataclasses import dataclass
import math

import numpy as np

from elastictrainer.method.selector import _as_importance, as_times_ms, eq3_cost

__all__ = ["RateResult", "best_gain", "best_rate"]

# rates this close (relative) count as equal, so that the cheaper selection wins a tie the
# float sums cannot tell apart
_REL_TIE = 1e-12


@dataclass
class RateResult:
    """The best-rate selection (output-first mask), its importance I(m), its step time T(m)
    (ms: F plus eq. 3's cost, summed with math.fsum) and its rate I(m) / T(m); `iterations`:
    Dinkelbach iterations it took."""
    mask: np.ndarray
    importance: float
    time_ms: float
    rate: float
    iterations: int = 0

    @property
    def deepest(self):
        sel = np.flatnonzero(self.mask)
        return int(sel[-1]) if sel.size else None


def _by_depth(imp, t_dw, reach, lam):
    """For every deepest tensor d, the maximiser of I - lam * T with d forced in: which tensors
    above d it takes (`take`, one flag per tensor, valid above any d), and its I and T
    without F (arrays over d; `reach`[d]: the chain and forward terms down to d)."""
    take = (imp > 0) & (imp - lam * t_dw > 0)

    def above(x):  # sum over the taken tensors above each d
        return np.concatenate([[0.0], np.cumsum(np.where(take, x, 0.0))[:-1]])
    return take, imp + above(imp), reach + t_dw + above(t_dw)


class _Problem:
    """The checked inputs of one solve: times (ms, output first), importance, F and the tensors
    that may be the deepest (positive importance, not `not_deepest`)."""

    def __init__(self, t_dw_ms, t_dy_ms, importance, fixed_ms, t_fw_ms, not_deepest):
        self.t_dw, self.t_dy, self.t_fw, self.fw = as_times_ms(t_dw_ms, t_dy_ms, t_fw_ms)
        self.imp = _as_importance(importance, self.t_dw.shape[0])
        self.fixed = float(fixed_ms)
        if not (math.isfinite(self.fixed) and self.fixed > 0):
            raise ValueError(f"fixed_ms must be positive and finite, got {fixed_ms}")
        self.allowed = self.imp > 0
        if not_deepest is not None:
            self.allowed[int(not_deepest)] = False
        self.reach = self.fixed + np.cumsum(self.t_dy + self.t_fw)

    def by_depth(self, lam):
        return _by_depth(self.imp, self.t_dw, self.reach, lam)

    def result(self, take, tied, time, iterations):
        """The RateResult of the cheapest (then shallowest) of the `tied` deepest tensors."""
        d = int(tied[np.lexsort((tied, time[tied]))[0]])
        mask = np.zeros(self.imp.shape[0], bool)
        mask[:d] = take[:d]
        mask[d] = True
        total = self.fixed + eq3_cost(self.t_dw, self.t_dy, mask, self.fw)
        got = math.fsum(self.imp[mask].tolist())
        return RateResult(mask, got, total, got / total, iterations)


def best_rate(t_dw_ms, t_dy_ms, importance, fixed_ms, t_fw_ms=None, not_deepest=None,
              max_iterations=None):
    """The selection of the most importance per ms of step time (module docstring), times in
    ms, output first; fixed_ms: F (> 0); t_fw_ms: a cached prefix's forward increments by depth
    (selector.eq3_parts); not_deepest: an index that may not be the deepest selected tensor
    (the best selection of another depth, a runner-up).  Returns a RateResult, or None when no
    tensor of positive importance may be selected."""
    p = _Problem(t_dw_ms, t_dy_ms, importance, fixed_ms, t_fw_ms, not_deepest)
    if not p.allowed.any():
        return None
    limit = max_iterations or 4 * p.imp.shape[0] + 20  # never reached: the lambdas rise strictly
    lam, iterations = 0.0, 0
    while iterations < limit:
        iterations += 1
        _, gain, time = p.by_depth(lam)
        value = np.where(p.allowed, gain - lam * time, -np.inf)
        d = int(np.argmax(value))
        rate = gain[d] / time[d]
        if rate <= lam:  # P(lam) = 0 up to rounding: lam is the best rate
            break
        lam = rate
    # the maximisers at lam* are the best selections; of rates equal within rounding the
    # least step time, then the shallowest
    take, gain, time = p.by_depth(lam)
    rates = np.where(p.allowed, gain / time, -np.inf)
    return p.result(take, np.flatnonzero(rates >= rates.max() * (1 - _REL_TIE)), time,
                    iterations)


def best_gain(t_dw_ms, t_dy_ms, importance, fixed_ms, t_fw_ms=None, not_deepest=None):
    """The maximiser of I(m) - lambda_f * T(m), lambda_f = I(all) / T(all) (module docstring's
    gain objective), arguments as best_rate's.  Returns a RateResult (iterations 1), or None
    when no tensor of positive importance may be selected."""
    p = _Problem(t_dw_ms, t_dy_ms, importance, fixed_ms, t_fw_ms, not_deepest)
    if not p.allowed.any():
        return None
    everything = p.fixed + eq3_cost(p.t_dw, p.t_dy, np.ones(p.imp.shape[0], bool), p.fw)
    lam = max(math.fsum(p.imp.tolist()), 0.0) / everything
    take, gain, time = p.by_depth(lam)
    value = np.where(p.allowed, gain - lam * time, -np.inf)
    scale = max(float(np.max(np.abs(value[p.allowed]))), 1e-300)
    return p.result(take, np.flatnonzero(value >= value.max() - _REL_TIE * scale), time, 1)
