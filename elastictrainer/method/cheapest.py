"""The dual of eq. 3, for a budget users need not guess (--rho auto; not in the paper).

Eq. 3 takes a time budget and keeps the most importance under it.  With --rho auto the run
asks the opposite: the cheapest selection whose importance is at least a share of what all
tensors together would bring,

    minimise  cost(m)   subject to   sum_k m_k * I_k  >=  share * sum_k max(I_k, 0),

with eq. 3's cost (selector.eq3_parts: each selected tensor's t_dw, and t_dy of every tensor
from the output down to the deepest selected one).  Importance estimates the loss drop a
tensor's training brings (eq. 4-6), so the share is the part of the estimated loss drop the
run keeps; the time it then takes is what the selection amounts to, reported as a rho.

It is solved exactly the way selector.py solves eq. 3: fixing the deepest selected tensor d
fixes its error-gradient chain, and what remains is a knapsack over t_dw of the tensors above
it.  The knapsack table of the best importance at each integer cost, grown by one tensor per
step of the sweep over d, answers every sub-problem: for each d the least cost whose best
importance reaches the target, found by bisection since the table only grows with the cost.
O(N * T) for T the full cost in integer units.  Times are rounded up to whole units, so the
cost of the answer is an upper bound of its float cost, and the importance constraint holds
exactly.
"""
import math

import numpy as np

from elastictrainer.method.selector import (SelectionResult, _as_importance, _ceil_units,
                                            add_item, as_times_ms, eq3_cost, take_back)

__all__ = ["cheapest_units", "select_cheapest"]

# a target reached up to rounding in the sums counts as reached (the whole set must qualify
# for share 1)
_REL_TOL = 1e-12


def cheapest_units(t_dy, t_dw, imp, target, not_deepest=None):
    """The least-cost mask (bool array) whose importance reaches `target`, for integer unit
    times (int64 arrays, output first); the empty mask when target <= 0, None when no mask
    reaches it.  not_deepest: an index that may not be the deepest selected tensor (the
    cheapest selection of another depth, a runner-up)."""
    n = imp.shape[0]
    mask = np.zeros(n, dtype=bool)
    if target <= 0:
        return mask
    if imp[imp > 0].sum() < target * (1 - _REL_TOL):
        return None
    target = target * (1 - _REL_TOL)
    chain = np.cumsum(t_dy)
    full = int(t_dw.sum())
    # table[c]: the most importance of a subset of the tensors above d with t_dw-cost <= c
    table = np.zeros(full + 1, dtype=np.float64)
    take = [None] * n
    best = None  # (cost, -importance, d, c)
    for d in range(n):
        if imp[d] > 0:
            need = target - imp[d]
            c = 0 if need <= 0 else int(np.searchsorted(table, need, side="left"))
            if c < table.size and d != not_deepest:
                cost = int(chain[d] + t_dw[d] + c)
                key = (cost, -(imp[d] + table[c]), d, c)
                if best is None or key < best:
                    best = key
            table, take[d] = add_item(table, int(t_dw[d]), imp[d])
    if best is None:
        return None
    _, _, d, c = best
    return take_back(mask, take, t_dw, d, c)


def select_cheapest(t_dw_ms, t_dy_ms, importance, share, resolution=1000, t_fw_ms=None,
                    not_deepest=None):
    """The cheapest selection keeping `share` (0 < share <= 1) of the positive importance
    (module docstring), with float times in ms; one unit is the full backward cost over
    `resolution`.  t_fw_ms: a cached prefix's forward increments by depth (selector.eq3_parts);
    not_deepest: as cheapest_units'.  Returns a selector.SelectionResult whose budget_ms is the
    full backward cost, or None when no selection with another deepest tensor keeps the
    share."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    t_dw, t_dy, t_fw, fw = as_times_ms(t_dw_ms, t_dy_ms, t_fw_ms)
    imp = _as_importance(importance, t_dw.shape[0])
    chain = t_dy + t_fw  # the DP sees the forward increments as part of the chain
    full_ms = math.fsum(t_dw.tolist() + chain.tolist())
    n = t_dw.shape[0]
    target = share * float(imp[imp > 0].sum())
    if n == 0 or target <= 0 or full_ms <= 0:
        if not_deepest is not None:  # one answer only: nothing, or every tensor for free
            return None
        mask = np.zeros(n, dtype=bool) if full_ms > 0 or target <= 0 else imp > 0
        return SelectionResult(mask, float(imp[mask].sum()),
                               eq3_cost(t_dw, t_dy, mask, fw), full_ms)
    resolution = int(resolution)
    if resolution < 1:
        raise ValueError(f"resolution must be >= 1, got {resolution}")
    dw_u = _ceil_units(t_dw, full_ms, resolution)
    dy_u = _ceil_units(chain, full_ms, resolution)
    mask = cheapest_units(dy_u, dw_u, imp, target, not_deepest)
    if mask is None and not_deepest is not None:
        return None
    if mask is None:  # cannot happen for share <= 1; kept total for callers' sake
        mask = imp > 0
    sel = np.flatnonzero(mask)
    cost_units = int(dw_u[sel].sum() + dy_u[: sel[-1] + 1].sum()) if sel.size else 0
    return SelectionResult(mask, float(imp[mask].sum()), eq3_cost(t_dw, t_dy, mask, fw),
                           full_ms, full_ms / resolution, cost_units)
