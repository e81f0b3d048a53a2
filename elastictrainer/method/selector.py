"""The tensor selector: exact selection for ElasticTrainer (MobiSys'23), paper eq. 3.

Tensors are indexed from the model OUTPUT (index 0) back toward the INPUT
(index N-1).  Training a mask ``m`` of tensors costs

    cost(m) = sum_k m_k * t_dw[k]  +  sum_{j=0..d} t_dy[j]

where ``d`` is the deepest selected tensor: every selected tensor needs its
weight gradient, and the error gradient has to be back-propagated from the
output down to the deepest selected tensor.  The empty mask costs 0.
Eq. 3 of the paper asks for

    maximise  sum_k m_k * I_k   subject to   cost(m) <= budget.

Decomposition used here
-----------------------
The t_dy term depends on the mask only through ``d``.  Fixing ``d`` fixes
``C_d = sum_{j<=d} t_dy[j]`` and forces ``m_d = 1``; what remains is a plain
0/1 knapsack over the weights ``t_dw[0..d-1]`` with capacity
``budget - C_d - t_dw[d]``.  Sweeping ``d = 0, 1, 2, ...`` lets a single
knapsack table grow by one item per step, so all N sub-problems are solved
in one pass of O(N * T) work (T = budget in integer units), each step being
a handful of vectorised numpy operations over the table.

Two entry points:

* :func:`selection_DP` -- integer time units and a budget fraction ``rho``;
  keeps the contract of the reference solver so results can be compared.
* :func:`select_tensors` -- float milliseconds and a budget in ms, for the
  training loop; discretises conservatively so the real cost of the returned
  mask never exceeds the budget.
"""
from dataclasses import dataclass
import math

import numpy as np

__all__ = ["selection_DP", "select_tensors", "SelectionResult", "eq3_cost", "eq3_parts"]


def _as_unit_times(x, name):
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iub":
        if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)):
            raise ValueError(f"{name} must hold integer time units")
    arr = arr.astype(np.int64)
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative")
    return arr


def _as_importance(x, n):
    imp = np.asarray(x, dtype=np.float64)
    if imp.ndim != 1 or imp.shape[0] != n:
        raise ValueError(f"importance must be a vector of length {n}, got shape {imp.shape}")
    if not np.all(np.isfinite(imp)):
        raise ValueError("importance must be finite")
    return imp


def _solve_units(t_dy, t_dw, imp, budget):
    """Optimal mask (bool array) for integer times and an integer budget.

    Arrays are assumed validated: int64, non-negative, same length.
    """
    n = imp.shape[0]
    mask = np.zeros(n, dtype=bool)
    if n == 0 or budget < 0:
        return mask
    # No mask can cost more than everything together, so a larger budget only
    # widens the table without changing the feasible set.
    budget = min(int(budget), int(t_dy.sum() + t_dw.sum()))

    # cap[d]: knapsack capacity left for tensors 0..d-1 when d is the deepest.
    cap = budget - np.cumsum(t_dy) - t_dw
    feasible = np.flatnonzero(cap >= 0)
    if feasible.size == 0:
        return mask
    last = int(feasible[-1])
    cap = cap[: last + 1]
    # need[k]: largest capacity any deepest-candidate >= k will query.  The
    # cumulative t_dy only grows with depth, so the table can shrink as the
    # sweep goes deeper instead of always spanning the whole budget.
    need = np.maximum.accumulate(cap[::-1])[::-1]

    # table[c] = best value of a subset of tensors 0..d-1 with t_dw-cost <= c
    # (monotone in c because it is an "at most c" table).
    table = np.zeros(int(need[0]) + 1, dtype=np.float64)
    # take[k]: None (never taken), True (zero weight: always taken) or a bool
    # row r where r[c - w] says item k was taken at capacity c >= w.
    take = [None] * (last + 1)

    best_val, best_d = 0.0, -1  # the empty selection is always allowed
    for d in range(last + 1):
        c = int(cap[d])
        if c >= 0:
            v = imp[d] + table[c]
            if v > best_val:
                best_val, best_d = v, d
        if d == last:
            break
        # Items with I <= 0 never help a knapsack whose deepest tensor is
        # already fixed: dropping them keeps d and lowers the cost.
        if imp[d] <= 0:
            continue
        table, take[d] = add_item(table[: int(need[d + 1]) + 1], int(t_dw[d]), imp[d])

    if best_d < 0:
        return mask
    return take_back(mask, take, t_dw, best_d, int(cap[best_d]))


def add_item(table, w, val):
    """Grow a 0/1 knapsack table ("at most c" form: table[c] is the best value of a subset
    costing at most c) by one item of weight `w` and value `val`; returns (the table, the
    item's take row for take_back: True when it weighs nothing, None when it fits nowhere,
    else a bool array r with r[c - w] telling whether it was taken at capacity c)."""
    if w == 0:
        return table + val, True
    if w >= table.size:
        return table, None
    shifted = table[: table.size - w] + val
    row = shifted > table[w:]  # strict: ties keep the lighter choice
    np.maximum(table[w:], shifted, out=table[w:])
    return table, row


def take_back(mask, take, t_dw, d, c):
    """The subset behind a knapsack answer: tensor `d` (the deepest) in `mask`, then the
    tensors above it the take rows (add_item's) say were taken at the capacity `c` left."""
    mask[d] = True
    for k in range(d - 1, -1, -1):
        row = take[k]
        if row is None:
            continue
        if row is True:
            mask[k] = True
            continue
        w = int(t_dw[k])
        if c >= w and row[c - w]:
            mask[k] = True
            c -= w
    return mask


def selection_DP(t_dy, t_dw, I, rho):
    """Solve paper eq. 3 exactly on integer time units.

    Args:
        t_dy: error-gradient times, non-negative integers, ordered from the
            output (index 0) back to the input.
        t_dw: weight-gradient times, same units and order.
        I: tensor importances (floats, any sign).
        rho: budget as a fraction of the full backward pass; the budget is
            ``int(rho * sum(t_dw + t_dy))`` units.

    Returns:
        ``(max_importance, mask)``: the global optimum of eq. 3 and a boolean
        mask of length N (True = train this tensor).  ``max_importance`` is
        recomputed as ``sum(I[mask])`` so the two always agree.

    Fixing the deepest selected tensor d turns eq. 3 into a 0/1 knapsack on
    t_dw over tensors 0..d-1; one knapsack table swept over d = 0..N-1 solves
    every such sub-problem in O(N * budget) time overall.
    """
    t_dy = _as_unit_times(t_dy, "t_dy")
    t_dw = _as_unit_times(t_dw, "t_dw")
    if t_dy.shape != t_dw.shape:
        raise ValueError(f"t_dy and t_dw differ in length: {t_dy.shape[0]} vs {t_dw.shape[0]}")
    imp = _as_importance(I, t_dy.shape[0])
    budget = int(rho * int(t_dw.sum() + t_dy.sum()))
    mask = _solve_units(t_dy, t_dw, imp, budget)
    return float(imp[mask].sum()), mask


@dataclass
class SelectionResult:
    """Outcome of :func:`select_tensors`.

    mask: bool array, True = train this tensor (index 0 = output side).
    importance: sum of the importances of the selected tensors.
    cost_ms: real cost of ``mask`` (eq. 3's cost with the float times,
        summed with ``math.fsum``); never above ``budget_ms`` unless the
        budget is negative and the mask is empty.
    budget_ms: the budget that was asked for.
    unit_ms: size of one discretisation unit (``budget_ms / resolution``),
        0.0 when no discretisation was needed.
    cost_units: cost of ``mask`` in those units (an upper bound on
        ``cost_ms / unit_ms``), 0 when no discretisation was needed.
    """

    mask: np.ndarray
    importance: float
    cost_ms: float
    budget_ms: float
    unit_ms: float = 0.0
    cost_units: int = 0

    @property
    def indices(self):
        return np.flatnonzero(self.mask)


def eq3_parts(t_dw, t_dy, mask, t_fw=None):
    """The terms of eq. 3's backward cost of `mask` (all arrays output-first): the t_dw of each
    selected tensor, and the t_dy of every tensor from the output down to the deepest selected
    one.  This is the one definition of the cost; time_model.py reorders its tables to use it.

    Added to the paper: `t_fw`, the forward pass a selection runs when its frozen prefix is
    cached (prefix/cache.py).  Such a step runs the forward pass only from the cut below its
    deepest tensor, so its forward time grows with the depth d as the error-gradient chain
    does: t_fw[j] is what the cut for depth j adds to the cut for depth j-1 (>= 0: the
    suffixes nest), and the third term is t_fw of every tensor down to the deepest selected
    one.  Folded into t_dy, it keeps eq. 3's form, so the DP below stays exact.  Returns
    (dw, dy, fw); fw is empty without t_fw (the paper's cost, a forward pass that does not
    depend on the selection)."""
    t_dw, t_dy = np.asarray(t_dw, dtype=np.float64), np.asarray(t_dy, dtype=np.float64)
    t_fw = t_dy[:0] if t_fw is None else np.asarray(t_fw, dtype=np.float64)
    sel = np.flatnonzero(mask)
    if sel.size == 0:
        return t_dw[:0], t_dy[:0], t_fw[:0]
    depth = int(sel[-1]) + 1
    return t_dw[sel], t_dy[:depth], t_fw[:depth]


def eq3_cost(t_dw, t_dy, mask, t_fw=None):
    """Eq. 3's backward cost of `mask` (plus the forward increments t_fw, eq3_parts), summed
    with math.fsum: fsum is correctly rounded, so if the exact cost is <= a float budget, the
    reported cost is too."""
    return math.fsum(np.concatenate(eq3_parts(t_dw, t_dy, mask, t_fw)).tolist())


def _ceil_units(times, budget_ms, resolution):
    """ceil(t / (budget_ms / resolution)) computed exactly, at most resolution + 1.

    Floating-point division can land a hair below an integer and make ceil
    round down, which would let the real cost creep past the budget; exact
    rational arithmetic on the float values rules that out.  A time past the
    whole budget is held at resolution + 1 units: it fits no selection either
    way, and a budget tiny against the times (a corrected time model's, just
    above its forward floor) would otherwise give units past int64.
    """
    bp, bq = float(budget_ms).as_integer_ratio()
    out = np.empty(len(times), dtype=np.int64)
    for i, t in enumerate(times.tolist()):
        tp, tq = float(t).as_integer_ratio()
        # t / (bp / (bq * R)) = tp * bq * R / (tq * bp)
        out[i] = min(-((-tp * bq * resolution) // (tq * bp)), resolution + 1)
    return out


def as_times_ms(t_dw_ms, t_dy_ms, t_fw_ms=None):
    """The solvers' float times, checked: (t_dw, t_dy, t_fw, fw) with t_fw zeros when no
    forward increments are given and fw what eq3_cost takes (None then)."""
    t_dw = np.asarray(t_dw_ms, dtype=np.float64)
    t_dy = np.asarray(t_dy_ms, dtype=np.float64)
    if t_dw.ndim != 1 or t_dy.shape != t_dw.shape:
        raise ValueError(f"t_dw_ms and t_dy_ms must be vectors of equal length, "
                         f"got shapes {t_dw.shape} and {t_dy.shape}")
    t_fw = np.zeros_like(t_dy) if t_fw_ms is None else np.asarray(t_fw_ms, dtype=np.float64)
    if t_fw.shape != t_dy.shape:
        raise ValueError(f"t_fw_ms must be a vector as long as t_dy_ms, got shape {t_fw.shape}")
    for name, arr in (("t_dw_ms", t_dw), ("t_dy_ms", t_dy), ("t_fw_ms", t_fw)):
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"{name} must be finite and non-negative")
    return t_dw, t_dy, t_fw, None if t_fw_ms is None else t_fw


def select_tensors(t_dw_ms, t_dy_ms, importance, budget_ms, resolution=1000, t_fw_ms=None):
    """Pick the tensors to train under a time budget in milliseconds (eq. 3).

    Discretisation: one unit is ``u = budget_ms / resolution``, so the budget
    is exactly ``resolution`` units and the DP table width (hence run time) is
    predictable regardless of how times are scaled.  Every time is rounded UP
    to whole units, which makes the integer cost an upper bound on the real
    cost: any mask the integer problem accepts really fits in ``budget_ms``.
    The answer is exact for the rounded-up problem; as ``resolution`` grows
    it converges to the exact float optimum.

    When the whole backward pass fits the budget, every mask is feasible and
    the exact answer (all positive-importance tensors) is returned without
    discretising.  A budget <= 0 yields the empty selection.

    Args:
        t_dw_ms, t_dy_ms: per-tensor times in ms (finite, >= 0), index 0 at
            the output.
        importance: per-tensor importance (finite floats, any sign).
        budget_ms: time budget for the backward pass in ms.
        resolution: number of integer units in the budget (>= 1).
        t_fw_ms: forward increments of a cached prefix by depth (eq3_parts), or None.

    Returns:
        :class:`SelectionResult`.
    """
    t_dw, t_dy, t_fw, fw = as_times_ms(t_dw_ms, t_dy_ms, t_fw_ms)
    dy_alone = t_dy
    # the DP sees the forward increments as part of the error-gradient chain (eq3_parts)
    t_dy = t_dy + t_fw
    imp = _as_importance(importance, t_dw.shape[0])
    resolution = int(resolution)
    if resolution < 1:
        raise ValueError(f"resolution must be >= 1, got {resolution}")
    budget_ms = float(budget_ms)
    if math.isnan(budget_ms):
        raise ValueError("budget_ms is NaN")

    n = t_dw.shape[0]
    if n == 0 or budget_ms <= 0:
        return SelectionResult(np.zeros(n, dtype=bool), 0.0, 0.0, budget_ms)

    if math.fsum(t_dw.tolist() + t_dy.tolist()) <= budget_ms:
        mask = imp > 0
        return SelectionResult(mask, float(imp[mask].sum()),
                               eq3_cost(t_dw, dy_alone, mask, fw), budget_ms)

    dw_u = _ceil_units(t_dw, budget_ms, resolution)
    dy_u = _ceil_units(t_dy, budget_ms, resolution)
    mask = _solve_units(dy_u, dw_u, imp, resolution)
    sel = np.flatnonzero(mask)
    cost_units = int(dw_u[sel].sum() + dy_u[: sel[-1] + 1].sum()) if sel.size else 0
    return SelectionResult(mask, float(imp[mask].sum()), eq3_cost(t_dw, dy_alone, mask, fw),
                           budget_ms, budget_ms / resolution, cost_units)
