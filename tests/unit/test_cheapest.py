"""--rho auto's selector (method/cheapest.py), the dual of eq. 3, against brute force."""
import itertools

import numpy as np
import pytest

from elastictrainer.method.cheapest import cheapest_units, select_cheapest
from elastictrainer.method.selector import eq3_cost


def _brute(t_dy, t_dw, imp, target):
    """The least eq. 3 cost of any mask reaching `target`, by trying every mask."""
    best = None
    for bits in itertools.product([False, True], repeat=len(imp)):
        mask = np.array(bits)
        if imp[mask].sum() >= target * (1 - 1e-12):
            cost = eq3_cost(t_dw, t_dy, mask)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_cheapest_mask_is_optimal_on_integer_times(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    t_dy = rng.integers(0, 6, n)
    t_dw = rng.integers(0, 9, n)
    imp = rng.normal(0.3, 1.0, n)
    share = float(rng.choice([0.1, 0.5, 0.8, 0.95, 1.0]))
    target = share * imp[imp > 0].sum()
    mask = cheapest_units(t_dy, t_dw, imp, target)
    expected = _brute(t_dy, t_dw, imp, target)
    assert mask is not None and expected is not None
    assert imp[mask].sum() >= target * (1 - 1e-12)  # the constraint holds
    assert eq3_cost(t_dw, t_dy, mask) == expected  # and nothing cheaper does


def test_edge_cases():
    t = np.array([2, 3, 4])
    imp = np.array([-1.0, 0.0, -2.0])
    assert not cheapest_units(t, t, imp, 0.0).any()  # nothing to keep: train nothing
    assert cheapest_units(t, t, np.array([1.0, 1.0, 1.0]), 4.0) is None  # unreachable
    # the whole positive importance asked: every positive tensor, none of the others
    imp = np.array([1.0, -1.0, 2.0])
    mask = cheapest_units(t, t, imp, 3.0)
    assert mask.tolist() == [True, False, True]


def test_a_smaller_share_never_costs_more_and_float_times_round_up():
    rng = np.random.default_rng(7)
    t_dw, t_dy, imp = rng.uniform(0, 5, 30), rng.uniform(0, 3, 30), rng.uniform(-0.2, 1, 30)
    costs = []
    for share in (0.2, 0.4, 0.6, 0.8, 1.0):
        res = select_cheapest(t_dw, t_dy, imp, share, resolution=2000)
        assert res.importance >= share * imp[imp > 0].sum() * (1 - 1e-12)
        assert res.cost_ms <= res.cost_units * res.unit_ms * (1 + 1e-12)  # units bound it
        costs.append(res.cost_units)
    assert costs == sorted(costs)  # the rounded problem's optimum grows with the share
    with pytest.raises(ValueError, match="share"):
        select_cheapest(t_dw, t_dy, imp, 0.0)


@pytest.mark.parametrize("seed", range(30))
def test_the_runner_up_is_the_cheapest_keeping_the_target_with_another_deepest_tensor(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 10))
    t_dy, t_dw, imp = rng.integers(0, 6, n), rng.integers(0, 9, n), rng.normal(0.3, 1.0, n)
    imp[0] = abs(imp[0])  # something to keep
    target = float(rng.choice([0.3, 0.7, 0.9])) * imp[imp > 0].sum()
    first = cheapest_units(t_dy, t_dw, imp, target)
    d = int(np.flatnonzero(first)[-1])
    second = cheapest_units(t_dy, t_dw, imp, target, not_deepest=d)
    best = None  # by brute force, over masks whose deepest tensor is another of positive worth
    for bits in itertools.product([False, True], repeat=n):
        mask = np.array(bits)
        if mask.any() and imp[mask].sum() >= target * (1 - 1e-12):
            deepest = np.flatnonzero(mask)[-1]
            if deepest != d and imp[deepest] > 0:
                cost = eq3_cost(t_dw, t_dy, mask)
                best = cost if best is None else min(best, cost)
    if best is None:
        assert second is None
    else:
        assert np.flatnonzero(second)[-1] != d and imp[second].sum() >= target * (1 - 1e-12)
        assert eq3_cost(t_dw, t_dy, second) == best
