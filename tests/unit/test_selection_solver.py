"""Exactness tests for selection_solver_DP against an exhaustive search."""
import math
from fractions import Fraction

import numpy as np
import pytest

from elastictrainer.method.selector import SelectionResult, select_tensors, selection_DP


def all_masks(n):
    """Every 0/1 mask of length n as a (2^n, n) bool matrix."""
    codes = np.arange(2 ** n, dtype=np.int64)
    return ((codes[:, None] >> np.arange(n)) & 1).astype(bool)


def mask_costs(masks, t_dw, t_dy):
    """Eq. 3 cost of each row of masks; exact for integer inputs."""
    masks = np.atleast_2d(masks)
    n = masks.shape[1]
    dw_part = masks.astype(np.float64) @ np.asarray(t_dw, dtype=np.float64)
    any_sel = masks.any(axis=1)
    deepest = n - 1 - np.argmax(masks[:, ::-1], axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(t_dy, dtype=np.float64))])
    dy_part = np.where(any_sel, prefix[deepest + 1], 0.0)
    return dw_part + dy_part


def brute_force(t_dw, t_dy, imp, budget):
    """Best value over all masks whose cost is <= budget (empty mask always allowed)."""
    n = len(imp)
    if n == 0:
        return 0.0
    masks = all_masks(n)
    values = masks.astype(np.float64) @ np.asarray(imp, dtype=np.float64)
    costs = mask_costs(masks, t_dw, t_dy)
    ok = (costs <= budget) | ~masks.any(axis=1)
    return float(values[ok].max())


def random_int_instance(rs):
    n = rs.randint(1, 13)
    kind = rs.randint(6)
    hi = rs.choice([1, 3, 10, 50])
    t_dw = rs.randint(0, hi + 1, size=n)
    t_dy = rs.randint(0, hi + 1, size=n)
    if kind == 0:  # zero times mixed in
        t_dw[rs.rand(n) < 0.4] = 0
        t_dy[rs.rand(n) < 0.4] = 0
    imp = rs.randn(n)
    if kind == 1:
        imp = -np.abs(imp)
    elif kind == 2:
        imp[rs.rand(n) < 0.3] = 0.0
    elif kind == 3:  # many ties
        imp = rs.randint(-2, 4, size=n).astype(float)
    rho = rs.choice([0.0, 0.01, 0.05, 0.2, 0.4, 0.6, 0.9, 1.0, 3.0, rs.rand()])
    return t_dw, t_dy, imp, rho


@pytest.mark.parametrize("seed", range(6))
def test_selection_dp_matches_brute_force(seed):
    rs = np.random.RandomState(seed)
    for _ in range(300):
        t_dw, t_dy, imp, rho = random_int_instance(rs)
        budget = int(rho * np.sum(t_dw + t_dy))
        value, mask = selection_DP(t_dy, t_dw, imp, rho)
        mask = np.asarray(mask)
        assert mask.shape == (len(imp),)
        assert mask.dtype == bool
        assert value == pytest.approx(brute_force(t_dw, t_dy, imp, budget), abs=1e-9)
        assert value == float(imp[mask].sum())
        if mask.any():
            assert mask_costs(mask, t_dw, t_dy)[0] <= budget
        # a strictly negative tensor only lowers the value, even as the deepest one
        assert not np.any(mask & (imp < 0))


def test_selection_dp_accepts_lists_and_integral_floats():
    value, mask = selection_DP([1.0, 2.0, 3.0], [4, 5, 6], [1.0, 2.0, 3.0], 0.5)
    assert value == pytest.approx(brute_force([4, 5, 6], [1, 2, 3], [1.0, 2.0, 3.0], 10))
    assert mask.dtype == bool


def test_selection_dp_rejects_bad_input():
    with pytest.raises(ValueError):
        selection_DP([1.5, 2], [1, 1], [1, 1], 0.5)
    with pytest.raises(ValueError):
        selection_DP([-1, 2], [1, 1], [1, 1], 0.5)
    with pytest.raises(ValueError):
        selection_DP([1, 2, 3], [1, 1], [1, 1], 0.5)
    with pytest.raises(ValueError):
        selection_DP([1, 2], [1, 1], [1, np.nan], 0.5)


def test_selection_dp_edge_cases():
    value, mask = selection_DP([], [], [], 0.5)
    assert value == 0.0 and mask.shape == (0,)
    # all-zero times: every positive tensor is free
    value, mask = selection_DP([0, 0, 0], [0, 0, 0], [1.0, -1.0, 2.0], 0.0)
    assert value == 3.0 and mask.tolist() == [True, False, True]
    # all-negative importances: nothing is worth training
    value, mask = selection_DP([1, 1], [1, 1], [-1.0, -0.5], 1.0)
    assert value == 0.0 and not mask.any()
    # a negative tensor deep in the net must not be selected just to be "deepest"
    value, mask = selection_DP([1, 1, 1], [1, 1, 1], [1.0, -5.0, 0.5], 1.0)
    assert value == 1.5 and mask.tolist() == [True, False, True]
    # zero budget
    value, mask = selection_DP([1, 1], [1, 1], [1.0, 1.0], 0.0)
    assert value == 0.0 and not mask.any()
    # huge budget: all positive tensors
    value, mask = selection_DP([3, 1, 4], [1, 5, 9], [1.0, 0.0, 2.0], 1e6)
    assert value == 3.0 and mask[0] and mask[2]


def test_selection_dp_depth_tradeoff():
    # The deep tensor is the most important, but reaching it costs its t_dy chain.
    t_dy = [1, 1, 1, 10]
    t_dw = [2, 2, 2, 2]
    imp = [1.0, 1.0, 1.0, 2.5]
    # total = 21, budget = 15: deep tensor alone costs 13+2 = 15 -> 2.5
    # shallow three cost 3 + 6 = 9 -> 3.0
    value, mask = selection_DP(t_dy, t_dw, imp, 15 / 21)
    assert value == 3.0 and mask.tolist() == [True, True, True, False]
    # budget 17 allows deep + one shallow (13 + 4) -> 3.5
    value, mask = selection_DP(t_dy, t_dw, imp, 17 / 21 + 1e-12)
    assert value == 3.5 and mask[3] and mask.sum() == 2


def random_float_instance(rs):
    n = rs.randint(1, 11)
    t_dw = rs.exponential(1.0, size=n) * rs.choice([0.01, 1.0, 100.0])
    t_dy = rs.exponential(1.0, size=n) * rs.choice([0.01, 1.0, 100.0])
    if rs.rand() < 0.3:
        t_dw[rs.rand(n) < 0.4] = 0.0
        t_dy[rs.rand(n) < 0.4] = 0.0
    imp = rs.randn(n)
    if rs.rand() < 0.15:
        imp = -np.abs(imp)
    frac = rs.choice([0.001, 0.05, 0.3, 0.5, 0.8, 0.99, 1.0, 2.0, rs.rand()])
    budget = frac * float(np.sum(t_dw + t_dy))
    resolution = int(rs.choice([1, 3, 10, 100, 1000]))
    return t_dw, t_dy, imp, budget, resolution


@pytest.mark.parametrize("seed", range(4))
def test_select_tensors_never_exceeds_budget_and_is_exact_when_discretised(seed):
    rs = np.random.RandomState(100 + seed)
    for _ in range(250):
        t_dw, t_dy, imp, budget, resolution = random_float_instance(rs)
        res = select_tensors(t_dw, t_dy, imp, budget, resolution=resolution)
        assert isinstance(res, SelectionResult)
        assert res.mask.dtype == bool and res.mask.shape == imp.shape
        assert res.importance == float(imp[res.mask].sum())
        assert res.cost_ms <= budget
        assert res.cost_ms == pytest.approx(mask_costs(res.mask, t_dw, t_dy)[0])
        # brute_force sums costs in float, which can put a mask that fits
        # exactly a few ulps over; a hair of slack keeps this an upper bound.
        float_opt = brute_force(t_dw, t_dy, imp, budget * (1 + 1e-12))
        assert res.importance <= float_opt + 1e-9
        if budget > 0:
            unit = Fraction(budget) / resolution
            dw_u = [math.ceil(Fraction(t) / unit) for t in t_dw]
            dy_u = [math.ceil(Fraction(t) / unit) for t in t_dy]
            disc_opt = brute_force(dw_u, dy_u, imp, resolution)
            assert res.importance >= disc_opt - 1e-9


def test_select_tensors_converges_with_resolution():
    # Rounding up loses at most one unit per tensor, so at a fine resolution
    # the discretised optimum is the float optimum unless the latter sits
    # within ~N units of the budget edge, which random instances rarely do.
    rs = np.random.RandomState(7)
    gaps = []
    for _ in range(40):
        n = 10
        t_dw = rs.exponential(1.0, size=n)
        t_dy = rs.exponential(1.0, size=n)
        imp = np.abs(rs.randn(n))
        budget = 0.5 * float(np.sum(t_dw + t_dy))
        opt = brute_force(t_dw, t_dy, imp, budget)
        fine = select_tensors(t_dw, t_dy, imp, budget, resolution=100000)
        assert fine.cost_ms <= budget
        gaps.append(opt - fine.importance)
    gaps = np.array(gaps)
    assert gaps.min() >= -1e-9
    assert np.mean(gaps < 1e-9) >= 0.9


def test_select_tensors_exact_boundary():
    # Binary-exact times: three tensors fill the budget exactly and fit.
    res = select_tensors([0.25] * 5, [0.0] * 5, [1.0] * 5, 0.75, resolution=3)
    assert res.mask.sum() == 3 and res.cost_ms == 0.75 and res.cost_units == 3
    # In floating point 3 * 0.1 > 0.3, so three tensors of 0.1 ms do NOT fit a
    # 0.3 ms budget; naive float division would round the ratio to 1 unit
    # each and accept them.
    res = select_tensors([0.1] * 5, [0.0] * 5, [1.0] * 5, 0.3, resolution=3)
    assert res.cost_ms <= 0.3 and res.mask.sum() == 1
    assert math.fsum([0.1, 0.1, 0.1]) > 0.3


def test_select_tensors_edge_cases():
    res = select_tensors([], [], [], 10.0)
    assert res.mask.shape == (0,) and res.importance == 0.0 and res.cost_ms == 0.0
    for budget in (0.0, -5.0):
        res = select_tensors([1.0, 2.0], [1.0, 1.0], [1.0, 1.0], budget)
        assert not res.mask.any() and res.importance == 0.0 and res.cost_ms == 0.0
    res = select_tensors([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, -2.0], 1.0)
    assert res.mask.tolist() == [True, False, False] and res.cost_ms == 0.0
    res = select_tensors([1.0, 1.0], [1.0, 1.0], [-1.0, -3.0], 100.0)
    assert not res.mask.any()
    res = select_tensors([1.0, 1.0], [1.0, 1.0], [1.0, 2.0], math.inf)
    assert res.mask.all() and res.cost_ms == 4.0
    # budget smaller than any single tensor
    res = select_tensors([1.0, 1.0], [1.0, 1.0], [1.0, 2.0], 1.5, resolution=1000)
    assert not res.mask.any()
    with pytest.raises(ValueError):
        select_tensors([1.0], [-1.0], [1.0], 1.0)
    with pytest.raises(ValueError):
        select_tensors([1.0], [1.0], [1.0], 1.0, resolution=0)
    with pytest.raises(ValueError):
        select_tensors([1.0, 2.0], [1.0], [1.0], 1.0)


def test_a_budget_tiny_against_the_times_selects_what_fits_without_overflowing():
    """A corrected time model just above its forward floor leaves a backward budget of a few
    ulps: each millisecond is then past 2**63 units of it.  What fits (tensors of no time)
    is still selected, exactly; nothing else is."""
    t_dw, t_dy, imp = [15.0, 0.0, 9.8], [13.9, 0.0, 9.4], [1.0, 0.5, 2.0]
    for budget in (1e-300, 5e-324, 1e-12):
        res = select_tensors(t_dw, t_dy, imp, budget, resolution=10000)
        assert res.mask.tolist() == [False, False, False] and res.cost_ms == 0.0
    res = select_tensors([0.0, 0.0, 9.8], [0.0, 0.0, 9.4], imp, 1e-300, resolution=10000)
    assert res.mask.tolist() == [True, True, False] and res.cost_ms == 0.0
