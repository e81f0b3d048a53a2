"""A numeric rho's tolerance (--rho_tolerance; TimeModel.select): the cheapest selection within a
share of eq. 3's best importance under rho, against brute force over every subset, and a run
that trains it."""
import itertools

import numpy as np
import pytest

from elastictrainer.config import Config
from elastictrainer.elastic.budget import Budget
from elastictrainer.errors import UserError
from elastictrainer.method.time_model import TimeModel
from tests.unit.test_elastic_runtime import Device, drive, make
from tests.unit.test_prefix_time_model import CACHE, chain_table

RESOLUTION = 10000


def _masks(n):
    for bits in itertools.product([False, True], repeat=n):
        yield np.array(bits)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("tolerance", [0.02, 0.1, 0.3])
def test_the_cheapest_within_the_tolerance_of_eq3s_best_equals_brute_force(
        seed, cached, tolerance):
    model = TimeModel(chain_table(seed=seed), cache=CACHE if cached else None)
    rng = np.random.default_rng(seed)
    importance = rng.uniform(-0.2, 1, 8) * (rng.random(8) > 0.1)
    rho = float(rng.uniform(model.rho_floor + 0.05, 0.9))
    eq3 = model.select(importance, rho, resolution=RESOLUTION)
    mask = model.select(importance, rho, resolution=RESOLUTION, tolerance=tolerance)
    best = importance[eq3].sum()
    target = (1 - tolerance) * best
    # by brute force: the cheapest selection within the tolerance of eq. 3's importance
    cheapest = min(model.cost_ms(m) for m in _masks(8) if importance[m].sum() >= target - 1e-12)
    backward = float(model.t_dw.sum() + model.t_dy.sum()
                     + (0.0 if model.t_fw is None else np.sum(model.t_fw)))
    grid = 8 * backward / RESOLUTION  # the unit grid's rounding, one unit a tensor
    if np.array_equal(mask, eq3):
        # kept only when no such selection saves the tolerance's share of the step
        assert (model._intercept_ms + cheapest + grid) / model.t_full > (
            (1 - tolerance) * model.predicted_ratio(eq3)) or not eq3.any()
    else:
        assert importance[mask].sum() >= target - 1e-9
        assert model.cost_ms(mask) <= cheapest + grid + 1e-9
        assert model.predicted_ratio(mask) <= (1 - tolerance) * model.predicted_ratio(eq3) + 1e-12
    assert np.array_equal(model.select(importance, rho, resolution=RESOLUTION, tolerance=0.0),
                          eq3)


def test_the_tolerance_switches_on_the_cases_brute_force_finds():
    """The check above is not vacuous: over its cases some selections switch, some stay."""
    switched = kept = 0
    for seed in range(12):
        for cached in (False, True):
            model = TimeModel(chain_table(seed=seed), cache=CACHE if cached else None)
            rng = np.random.default_rng(seed)
            importance = rng.uniform(-0.2, 1, 8) * (rng.random(8) > 0.1)
            rho = float(rng.uniform(model.rho_floor + 0.05, 0.9))
            eq3 = model.select(importance, rho, resolution=RESOLUTION)
            mask = model.select(importance, rho, resolution=RESOLUTION, tolerance=0.1)
            switched += not np.array_equal(mask, eq3)
            kept += np.array_equal(mask, eq3)
    assert switched and kept


def _deep_and_dear(n=4):
    """Tensor 0 (deepest) brings 3% of the importance behind a dear chain; rho 1 affords it."""
    tensors = [{"rank": n - 1, "t_dw_ms": 2.0, "t_dy_ms": 10.0 * (n - 1) / 3}] + [
        {"rank": r, "t_dw_ms": 1.0, "t_dy_ms": 1.0} for r in range(n - 2, -1, -1)]
    backward = sum(t["t_dw_ms"] + t["t_dy_ms"] for t in tensors)
    model = TimeModel({"tensors": tensors, "t_fp_ms": 4.0, "t_full_ms": 4.0 + backward})
    return model, np.array([0.03] + [0.97 / (n - 1)] * (n - 1))


def test_a_tolerance_leaves_out_a_deep_tensor_that_brings_little_for_its_cost():
    model, importance = _deep_and_dear()
    assert model.select(importance, 1.0).all()  # eq. 3 spends the whole budget
    mask = model.select(importance, 1.0, tolerance=0.05)
    assert mask.tolist() == [False, True, True, True]
    assert model.predicted_ratio(mask) < 0.5 * model.predicted_ratio(np.ones(4, bool))
    # a tolerance below the deep tensor's share keeps it
    assert model.select(importance, 1.0, tolerance=0.02).all()


def test_a_tolerance_does_not_trade_importance_for_a_sliver_of_the_step():
    """Three tensors of near-free weight gradients bring 4% of the importance: dropping them
    keeps 96% but saves under 1% of the step, so eq. 3's answer stays."""
    tensors = [{"rank": 3, "t_dw_ms": 5.0, "t_dy_ms": 0.0}] + [
        {"rank": r, "t_dw_ms": 0.03, "t_dy_ms": 2.0} for r in (2, 1, 0)]
    model = TimeModel({"tensors": tensors, "t_fp_ms": 10.0, "t_full_ms": 21.09})
    importance = np.array([0.96, 0.013, 0.013, 0.014])
    assert model.select(importance, 1.0, tolerance=0.05).all()
    assert model.select_share(importance, 0.95).tolist() == [True, False, False, False]


def test_a_run_with_a_tolerance_trains_the_cheaper_selection_and_says_its_budget():
    model, importance = _deep_and_dear(8)  # as many tensors as the scripted device has
    for tolerance, expected in ((0.0, tuple(range(8))), (0.05, tuple(range(1, 8)))):
        device = Device(model)
        rt = make(model, device, rho=1.0, total=40, steps_per_epoch=10, interval=2,
                  tolerance=tolerance, economy=False, feedback=False)
        drive(rt, device, 5, importance)
        assert rt.selection == expected
    assert Budget(0.4, tolerance=0.05).text == ("0.4 (giving up at most 5% of eq. 3's estimated "
                                                "loss drop for at least 5% of the step)")
    assert Budget(0.4).text == "0.4"
    with pytest.raises(ValueError):
        Budget(0.4, tolerance=1.0)


@pytest.mark.parametrize("settings,words", [
    ({"rho": 0.5, "rho_tolerance": -0.1}, "must be in [0, 1)"),
    ({"rho": 0.5, "rho_tolerance": 1.0}, "must be in [0, 1)"),
    ({"rho": "auto", "rho_tolerance": 0.05}, "already the cheapest selection"),
])
def test_the_flag_refuses_what_it_cannot_mean(settings, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace(")", r"\)")):
        Config(**settings).validate()
