"""--rho auto's rate objective (method/rate.py): the selection of the most importance per ms
of step time, against brute force over every subset; its time model method with the prefix
cache's pricing; edge cases."""
from fractions import Fraction
import itertools

import numpy as np
import pytest

from elastictrainer.method.rate import best_gain, best_rate
from elastictrainer.method.selector import eq3_cost
from elastictrainer.method.time_model import STEP_FLOOR, TimeModel
from tests.unit.test_prefix_time_model import CACHE, chain_table


def _masks(n):
    for bits in itertools.product([False, True], repeat=n):
        yield np.array(bits)


def _brute(t_dw, t_dy, imp, fixed, t_fw=None, not_deepest=None):
    """(best rate, least step time among the masks of that rate) over every mask of positive
    importance whose deepest tensor is not `not_deepest`, and, for a runner-up, of positive
    importance itself (else the best mask with a worthless tensor added below it would do);
    None when there is none."""
    best = None
    for mask in _masks(len(imp)):
        if not mask.any():
            continue
        deepest = np.flatnonzero(mask)[-1]
        if not_deepest is not None and (deepest == not_deepest or imp[deepest] <= 0):
            continue
        gain = imp[mask].sum()
        if gain <= 0:
            continue
        time = fixed + eq3_cost(t_dw, t_dy, mask, t_fw)
        rate = gain / time
        if best is None or rate > best[0] * (1 + 1e-12):
            best = (rate, time)
        elif rate >= best[0] * (1 - 1e-12):
            best = (max(best[0], rate), min(best[1], time))
    return best


def _case(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 11))
    t_dw = rng.uniform(0, 5, n) * (rng.random(n) > 0.15)  # some weight gradients free
    t_dy = rng.uniform(0, 3, n) * (rng.random(n) > 0.15)
    t_fw = None if seed % 3 == 0 else rng.uniform(0, 4, n) * (rng.random(n) > 0.5)
    imp = rng.normal(0.2, 1.0, n)
    imp[rng.random(n) < 0.2] = 0.0
    fixed = float(rng.uniform(0.05, 8))
    return t_dw, t_dy, imp, fixed, t_fw


@pytest.mark.parametrize("seed", range(120))
def test_the_best_rate_equals_brute_force(seed):
    t_dw, t_dy, imp, fixed, t_fw = _case(seed)
    res = best_rate(t_dw, t_dy, imp, fixed, t_fw_ms=t_fw)
    expected = _brute(t_dw, t_dy, imp, fixed, t_fw)
    if expected is None:
        assert res is None and not (imp > 0).any()
        return
    # what it reports is its mask's, and nothing has a better rate
    assert res.time_ms == pytest.approx(fixed + eq3_cost(t_dw, t_dy, res.mask, t_fw), rel=1e-12)
    assert res.rate == pytest.approx(imp[res.mask].sum() / res.time_ms, rel=1e-12)
    assert res.rate == pytest.approx(expected[0], rel=1e-9)
    # of the best rate, the cheapest selection
    assert res.time_ms <= expected[1] * (1 + 1e-9)
    assert (imp[res.mask] > 0).all()  # only positive importance can help
    # the runner-up: the best selection whose deepest tensor is another
    second = best_rate(t_dw, t_dy, imp, fixed, t_fw_ms=t_fw, not_deepest=res.deepest)
    other = _brute(t_dw, t_dy, imp, fixed, t_fw, not_deepest=res.deepest)
    if other is None:
        assert second is None
    else:
        assert second.deepest != res.deepest
        assert second.rate == pytest.approx(other[0], rel=1e-9) and second.rate <= res.rate


@pytest.mark.parametrize("seed", range(60))
def test_ties_on_exact_numbers_go_to_the_cheapest_selection(seed):
    """Small integers make equal rates common; the rates compared as exact fractions."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 9))
    t_dw, t_dy = rng.integers(0, 4, n).astype(float), rng.integers(0, 3, n).astype(float)
    imp = rng.integers(-2, 5, n).astype(float)
    fixed = float(rng.integers(1, 5))
    res = best_rate(t_dw, t_dy, imp, fixed)
    best = None
    for mask in _masks(n):
        gain = int(imp[mask].sum())
        if mask.any() and gain > 0:
            time = Fraction(int(fixed + eq3_cost(t_dw, t_dy, mask)))
            key = (Fraction(gain) / time, -time)
            best = key if best is None else max(best, key)
    if best is None:
        assert res is None
        return
    assert Fraction(int(imp[res.mask].sum())) / Fraction(int(res.time_ms)) == best[0]
    assert res.time_ms == -best[1]


def test_edge_cases():
    t = np.array([1.0, 2.0, 3.0])
    # nothing of positive importance: no selection (the caller falls back, budget.py)
    assert best_rate(t, t, np.array([-1.0, 0.0, -0.5]), 1.0) is None
    assert best_rate(np.zeros(0), np.zeros(0), np.zeros(0), 1.0) is None
    # one tensor of positive importance: it alone, however deep; its depth excluded: none
    res = best_rate(t, t, np.array([0.0, -1.0, 2.0]), 1.0)
    assert res.mask.tolist() == [False, False, True]
    assert res.rate == pytest.approx(2.0 / (1 + 6 + 3))
    assert best_rate(t, t, np.array([0.0, -1.0, 2.0]), 1.0, not_deepest=2) is None
    # a tensor whose importance per ms equals the rate is left out: the same rate, cheaper
    # (head alone: 2 / (1 + 1 + 0) = 1; with tensor 1's t_dw 1 and importance 1 it stays 1)
    res = best_rate(np.array([0.0, 1.0]), np.array([1.0, 0.0]), np.array([2.0, 1.0]), 1.0)
    assert res.mask.tolist() == [True, False] and res.rate == 1.0
    # a free tensor of positive importance is always worth taking
    res = best_rate(np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([1.0, 0.5]), 1.0)
    assert res.mask.tolist() == [True, True]
    with pytest.raises(ValueError, match="fixed_ms"):
        best_rate(t, t, np.ones(3), 0.0)
    # the iterations stop: a few even for many tensors
    rng = np.random.default_rng(5)
    big = best_rate(rng.uniform(0, 3, 400), rng.uniform(0, 2, 400), rng.normal(0, 1, 400), 50.0)
    assert big.iterations <= 10


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cached", [False, True])
def test_the_time_model_takes_the_best_rate_of_its_predicted_step_time(seed, cached):
    """TimeModel.select_rate maximises importance over the predicted step time
    (predicted_ratio x t_full), cached prefix's forward pass included, against all 2^8 masks;
    the runner-up is the best of another deepest tensor."""
    model = TimeModel(chain_table(seed=seed), cache=CACHE if cached else None)
    rng = np.random.default_rng(seed)
    importance = rng.uniform(-0.3, 1, 8)
    mask = model.select_rate(importance)

    def rate(m):
        return importance[m].sum() / model.predicted_ratio(m)

    masks = [m for m in _masks(8) if importance[m].sum() > 0]
    assert rate(mask) == pytest.approx(max(rate(m) for m in masks), rel=1e-9)
    d = model.deepest(mask)
    second = model.select_rate(importance, not_deepest=d)
    assert model.deepest(second) != d
    others = [m for m in masks if model.deepest(m) != d]
    assert rate(second) == pytest.approx(max(rate(m) for m in others), rel=1e-9)
    assert not model.select_rate(-np.abs(importance)).any()


def test_the_rate_weighs_importance_against_cost_where_the_share_does_not():
    """The deepest tensor brings a quarter of the importance behind a dear chain: a share of 0.9
    has to take it, the rate leaves it out."""
    tensors = [{"rank": 3, "t_dw_ms": 10.0, "t_dy_ms": 10.0}] + [
        {"rank": r, "t_dw_ms": 1.0, "t_dy_ms": 1.0} for r in (2, 1, 0)]
    model = TimeModel({"tensors": tensors, "t_fp_ms": 2.0, "t_full_ms": 28.0})
    importance = np.full(4, 0.25)
    share = model.select_share(importance, 0.9)
    best = model.select_rate(importance)
    assert share.tolist() == [True] * 4 and best.tolist() == [False, True, True, True]
    assert (importance[best].sum() / model.predicted_ratio(best)
            > importance[share].sum() / model.predicted_ratio(share))


def test_a_model_whose_intercept_went_below_zero_prices_steps_at_the_floor():
    model = TimeModel(chain_table()).corrected(3.0, 3.0)  # the backward pass 3x dearer
    assert model._intercept_ms < 0
    importance = np.linspace(0.1, 1, 8)
    mask = model.select_rate(importance)
    floor = STEP_FLOOR * model.t_full
    best = max((importance[m].sum() / (floor + model.cost_ms(m)) for m in _masks(8) if m.any()))
    assert importance[mask].sum() / (floor + model.cost_ms(mask)) == pytest.approx(best)


def test_a_selection_under_an_intercept_below_zero_is_never_predicted_free():
    # The head alone under a backward pass 3x dearer than profiled: intercept + cost < 0.  A
    # free prediction divided the head warm-up's seconds by zero when its record was closed.
    model = TimeModel(chain_table()).corrected(3.0, 3.0)
    head = np.zeros(8, bool)
    head[-1] = True
    assert model._intercept_ms + model.cost_ms(head) < 0
    assert model.predicted_ratio(head) == pytest.approx(STEP_FLOOR)


def _brute_gain(t_dw, t_dy, imp, fixed, t_fw=None, not_deepest=None):
    """(largest I(m) - lambda_f T(m), least step time of the masks reaching it) over the masks
    of positive importance (deepest not `not_deepest`, and of positive importance itself),
    lambda_f full training's rate; None when there is none."""
    n = len(imp)
    lam = max(imp.sum(), 0.0) / (fixed + eq3_cost(t_dw, t_dy, np.ones(n, bool), t_fw))
    best = None
    for mask in _masks(n):
        if not mask.any():
            continue
        deepest = np.flatnonzero(mask)[-1]
        if imp[deepest] <= 0 or (not_deepest is not None and deepest == not_deepest):
            continue
        time = fixed + eq3_cost(t_dw, t_dy, mask, t_fw)
        value = imp[mask].sum() - lam * time
        if best is None or value > best[0] + 1e-9:
            best = (value, time)
        elif value >= best[0] - 1e-9:
            best = (max(best[0], value), min(best[1], time))
    return best, lam


@pytest.mark.parametrize("seed", range(120))
def test_the_best_gain_over_full_trainings_rate_equals_brute_force(seed):
    t_dw, t_dy, imp, fixed, t_fw = _case(seed)
    res = best_gain(t_dw, t_dy, imp, fixed, t_fw_ms=t_fw)
    expected, lam = _brute_gain(t_dw, t_dy, imp, fixed, t_fw)
    if expected is None:
        assert res is None and not (imp > 0).any()
        return
    assert res.time_ms == pytest.approx(fixed + eq3_cost(t_dw, t_dy, res.mask, t_fw), rel=1e-12)
    assert imp[res.mask].sum() - lam * res.time_ms == pytest.approx(expected[0], abs=1e-9)
    assert res.time_ms <= expected[1] * (1 + 1e-9)
    # never a worse rate than full training's, never a better one than the best rate's
    assert res.rate >= lam * (1 - 1e-9)
    assert res.rate <= best_rate(t_dw, t_dy, imp, fixed, t_fw_ms=t_fw).rate * (1 + 1e-9)
    second = best_gain(t_dw, t_dy, imp, fixed, t_fw_ms=t_fw, not_deepest=res.deepest)
    other, _ = _brute_gain(t_dw, t_dy, imp, fixed, t_fw, not_deepest=res.deepest)
    if other is None:
        assert second is None
    else:
        assert second.deepest != res.deepest
        assert imp[second.mask].sum() - lam * second.time_ms == pytest.approx(other[0], abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cached", [False, True])
def test_the_gain_sits_between_the_best_rate_and_full_training(seed, cached):
    """TimeModel.select_gain: the largest importance beyond full training's rate times the
    predicted step, against all 2^8 masks; at least the best rate's step, at most a full one."""
    model = TimeModel(chain_table(seed=seed), cache=CACHE if cached else None)
    importance = np.random.default_rng(seed).uniform(-0.3, 1, 8)
    lam = importance.sum()  # full training's importance per full step (ratio 1)

    def excess(m):
        return importance[m].sum() - lam * model.predicted_ratio(m)

    mask = model.select_gain(importance)
    assert excess(mask) == pytest.approx(max(excess(m) for m in _masks(8) if m.any()), abs=1e-9)
    assert excess(mask) >= -1e-9
    rate = model.select_rate(importance)
    assert model.predicted_ratio(rate) <= model.predicted_ratio(mask) + 1e-9 <= 1 + 1e-9
