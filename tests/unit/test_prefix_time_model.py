"""Eq. 3 with a cached frozen prefix (selector.eq3_parts' t_fw, TimeModel(cache=...)) and the
closed loop's fit of cached steps: exact against an exhaustive search, no TensorFlow."""
import itertools

import numpy as np
import pytest

from elastictrainer.elastic.rho_control import RhoController, fit_scales
from elastictrainer.method.selector import eq3_cost, select_tensors
from elastictrainer.method.time_model import TimeModel


def chain_table(n=8, seed=0):
    """n tensors in a chain, tensor k at rank n-1-k (the last one is output-most)."""
    rng = np.random.default_rng(seed)
    t_dw, t_dy = rng.uniform(1, 4, n), rng.uniform(1, 4, n)
    tensors = [{"rank": n - 1 - k, "t_dw_ms": float(a), "t_dy_ms": float(b)}
               for k, (a, b) in enumerate(zip(t_dw, t_dy))]
    t_fp = 0.6 * float(t_dw.sum() + t_dy.sum())
    return {"tensors": tensors, "t_fp_ms": t_fp, "t_full_ms": t_fp + float(t_dw.sum() + t_dy.sum())}


# cut 0 below tensor 2, cut 1 below tensor 5: tensors 0-1 have none, 2-4 cut 0, 5-7 cut 1
CACHE = {"cuts": [{"name": "low", "forward_share": 0.7, "lookup_ms": 0.5},
                  {"name": "high", "forward_share": 0.25, "lookup_ms": 0.2}],
         "tensor_cut": [-1, -1, 0, 0, 0, 1, 1, 1]}


def test_a_cached_selection_costs_its_suffixs_forward_pass():
    table = chain_table()
    plain, cached = TimeModel(table), TimeModel(table, cache=CACHE)
    fp, full = table["t_fp_ms"], table["t_full_ms"]
    for mask, saved in (([0, 0, 0, 0, 0, 0, 1, 1], 0.75 * fp - 0.2),
                        ([0, 0, 0, 1, 0, 1, 0, 1], 0.3 * fp - 0.5),
                        ([1, 0, 0, 0, 0, 0, 0, 1], 0.0)):
        mask = np.array(mask, bool)
        assert cached.forward_saved(mask) == pytest.approx(saved)
        assert cached.predicted_ratio(mask) == pytest.approx(
            plain.predicted_ratio(mask) - saved / full)
    assert cached.cut_of(np.array([0, 0, 0, 0, 0, 0, 1, 1], bool)) == 1
    assert cached.cut_of(np.array([0, 0, 1, 0, 0, 0, 0, 1], bool)) == 0
    assert cached.cut_of(np.array([0, 1, 0, 0, 0, 0, 0, 1], bool)) is None
    assert cached.rho_floor == pytest.approx((0.25 * fp + 0.2) / full)
    assert cached.without_cache().predicted_ratio(np.ones(8, bool)) == pytest.approx(1.0)
    assert cached.without_cache().rho_floor == pytest.approx(plain.rho_floor)
    # training everything needs the whole forward pass: a full step, cache or not
    assert cached.predicted_ratio(np.ones(8, bool)) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_the_dp_with_a_cache_is_exact(seed):
    table = chain_table(seed=seed)
    model = TimeModel(table, cache=CACHE)
    rng = np.random.default_rng(seed)
    for rho in (0.2, 0.35, 0.5, 0.7, 0.9):
        importance = rng.uniform(-0.2, 1, 8)
        mask = model.select(importance, rho, resolution=100000)
        assert model.predicted_ratio(mask) <= rho + 1e-9
        best = max((importance[list(m)].sum() for m in (
            np.array(bits, bool) for bits in itertools.product([0, 1], repeat=8))
            if model.predicted_ratio(np.array(m, bool)) <= rho), default=0.0)
        got = importance[mask].sum() if mask.any() else 0.0
        assert got == pytest.approx(max(best, 0.0), abs=1e-3)


def test_the_solver_trades_a_deeper_selection_against_a_cached_one():
    table = chain_table()
    plain, cached = TimeModel(table), TimeModel(table, cache=CACHE)
    deep_first = np.array([1.0, 1.0, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
    gained = 0
    for rho in np.linspace(plain.rho_floor + 0.02, 0.98, 12):
        a, b = plain.select(deep_first, rho), cached.select(deep_first, rho)
        # the cache only adds cheaper options: never less importance at the same rho
        assert deep_first[b].sum() >= deep_first[a].sum() - 1e-9
        gained += deep_first[b].sum() > deep_first[a].sum() + 1e-9
        if a[:2].any() and not b[:2].any():
            # breaking the cache for the deep tensors was worth less than the cached suffix
            assert cached.predicted_ratio(a) <= rho + 1e-9
    assert gained
    rho = 0.9 * plain.rho_floor  # below the uncached floor: cached selections only
    shallow = cached.select(deep_first, rho)
    assert shallow.any() and not shallow[:2].any()
    assert cached.predicted_ratio(shallow) <= rho


def test_select_tensors_counts_the_forward_increments():
    t_dw, t_dy, t_fw = [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.0, 2.0, 0.0]
    res = select_tensors(t_dw, t_dy, [1.0, 1.0, 1.0], 3.0, t_fw_ms=t_fw)
    assert list(res.mask) == [True, False, False]  # tensor 1's forward increment costs 2
    assert res.cost_ms == eq3_cost(t_dw, t_dy, res.mask, t_fw) == 1.5
    res = select_tensors(t_dw, t_dy, [1.0, 1.0, 1.0], 6.0, t_fw_ms=t_fw)
    assert list(res.mask) == [True, True, False] and res.cost_ms == 5.0
    with pytest.raises(ValueError, match="t_fw_ms"):
        select_tensors(t_dw, t_dy, [1.0] * 3, 3.0, t_fw_ms=[1.0])


def test_the_closed_loop_fits_cached_steps_without_taking_their_forward_saving_for_backward():
    table = chain_table()
    base = TimeModel(table, cache=CACHE)
    truth = base.corrected(0.7, 0.7)  # backward ops 30% cheaper than profiled
    ctl = RhoController(base, 0.3)
    mask = np.array([0, 0, 0, 0, 0, 1, 1, 1], bool)
    for m in (mask, np.array([0, 0, 0, 0, 0, 0, 1, 1], bool)):
        ctl.correct(m, truth.predicted_ratio(m))
    a, b = fit_scales(base, ctl.points, (1.0, 1.0))
    assert a == pytest.approx(0.7, rel=0.02) and b == a
    assert ctl.model.predicted_ratio(mask) == pytest.approx(truth.predicted_ratio(mask), rel=0.02)
    ctl.drop_cache()
    assert ctl.model.cache is None and ctl.model.cut_of(mask) is None


def test_cache_flags_are_checked_before_anything_loads():
    from elastictrainer.errors import UserError
    from elastictrainer.config import Config

    with pytest.raises(UserError, match="--cache_budget_mb must be a size in MB >= 0"):
        Config(cache_frozen_prefix=True, cache_budget_mb=-1).validate()
    with pytest.raises(UserError, match="does not combine with --strategy mirrored"):
        Config(cache_frozen_prefix=True, strategy="mirrored").validate()
    Config(cache_frozen_prefix=True, cache_budget_mb=0).validate()  # on disk only


def drive_cached(rt, model, steps, fill_steps, importance, loop_s=1e-3):
    """The loop with a cached prefix on a scripted device: the selection's first `fill_steps`
    steps store images and cost an uncached step of it (the storing: what the prefix adds to
    the cached step), the later ones what the cached model predicts; probes and timed full
    steps a full step.  Returns the run's seconds."""
    plain, now = model.without_cache(), 0.0
    filled = 0
    for g in range(steps):
        if rt.reselect_due(g):
            rt.begin_reselection(g, probes=1)
        kind = rt.step_kind()
        mask = np.zeros(8, bool)
        fill, fill_ms = False, 0.0
        if kind == "selection":
            mask[list(rt.selection)] = True
            fill = filled < fill_steps
            filled += fill
            ms = (plain if fill else model).predicted_ratio(mask) * model.t_full
            fill_ms = ms - model.predicted_ratio(mask) * model.t_full if fill else 0.0
        else:
            ms = model.t_full
        now += ms / 1e3 + loop_s
        rt.step_done(g, kind, ms / 1e3, terms=importance if kind == "probe" else None,
                     filled=fill, fill_s=fill_ms / 1e3)
    return now


def test_steps_that_fill_the_cache_are_booked_apart_from_the_measured_cached_steps():
    from elastictrainer.elastic import ElasticRuntime

    model = TimeModel(chain_table(), cache=CACHE)
    rt = ElasticRuntime(model, 0.3, feedback=True, economy=False, steps_per_epoch=100,
                        total_steps=300, interval=10, log=lambda m: None, clock=lambda: 0.0)
    importance = np.linspace(0.1, 1.0, 8)
    seconds = drive_cached(rt, model, 300, 100, importance)
    record, = rt.records
    mask = np.array(record.mask, bool)
    assert model.cut_of(mask) is not None and record.cut in ("low", "high")
    assert record.fill_steps == 100
    # the closed loop measured the cached steps, the fill steps' storing left out
    assert record.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-6)
    assert model.predicted_ratio(mask) < 0.3 < model.without_cache().predicted_ratio(mask)
    result = rt.finish(seconds)
    assert result.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-6)
    # the fill steps count whole in the wall clock; full training runs their batches in full
    assert result.wall_ratio == pytest.approx(seconds / (300 * (model.t_full / 1e3 + 1e-3)),
                                              rel=1e-6)


def test_a_run_whose_every_selection_step_fills_the_cache_still_measures_its_ratio():
    """A short run, or one whose probes keep drawing images the store lacks: every selection
    step stores some images.  The storing is booked apart and the rest measured."""
    from elastictrainer.elastic import ElasticRuntime

    model = TimeModel(chain_table(), cache=CACHE)
    rt = ElasticRuntime(model, 0.3, feedback=True, economy=False, steps_per_epoch=100,
                        total_steps=100, interval=10, log=lambda m: None, clock=lambda: 0.0)
    seconds = drive_cached(rt, model, 100, 100, np.linspace(0.1, 1.0, 8))
    record, = rt.records
    mask = np.array(record.mask, bool)
    assert record.fill_steps == record.steps > 0
    assert record.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-6)
    result = rt.finish(seconds)
    assert result.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-6)


def test_a_switch_that_moves_the_cut_is_priced_an_epoch_of_filling():
    from elastictrainer.elastic.economy import Economy, Progress
    from elastictrainer.elastic.prices import Prices
    from elastictrainer.elastic.rho_control import RhoController

    model = TimeModel(chain_table(), cache=CACHE)
    prices = Prices(True, RhoController(model, 0.5, feedback=False), total_steps=300,
                    steps_per_epoch=100, probe_batches=1)
    economy = Economy(prices, every=1000,
                      is_compiled=lambda selection: True)  # no compile to pay: the refill alone
    high = np.array([0, 0, 0, 0, 0, 1, 1, 1], bool)
    low = np.array([0, 0, 1, 1, 1, 1, 1, 1], bool)
    # training `high` (its cut cached) since step 0
    now = Progress(current_ratio=model.predicted_ratio(high), current_cut=model.cut_name(high),
                   selected=True, selections_compiled=1)
    assert economy.prices.refill_s(np.array([0, 0, 0, 0, 0, 0, 1, 1], bool), now) == 0.0  # same cut
    refill = economy.prices.refill_s(low, now)
    assert refill == pytest.approx(100 * model.forward_saved(low) / 1e3)
    assert economy.worth_compiling((5, 6, 7), 10, now)
    assert not economy.worth_compiling(tuple(np.flatnonzero(low)), 10, now)  # 8% of 300 < refill


def test_a_correction_that_leaves_the_forward_less_than_a_cut_saves_predicts_what_it_fitted():
    """A cached selection measured well under its prediction (its steps skip more than the
    profiled forward's share: the input pipeline and augmenting) refits the backward scale
    upward, so the corrected forward pass is smaller than what the output-most cut saves: the
    corrected model must still predict, for the selection it measured, the ratio it fitted,
    and its DP must afford that selection at that ratio (not clip the forward at zero and
    price it higher than before the correction)."""
    table = chain_table()
    base = TimeModel(table, cache=CACHE)
    mask = np.array([0, 0, 0, 0, 0, 1, 1, 1], bool)
    before = base.predicted_ratio(mask)
    measured = 0.8 * before
    ctl = RhoController(base, 0.5)
    corrected = ctl.correct(mask, measured)
    assert ctl.dw_scale > 1.0  # the backward ops are dearer than the table says
    assert corrected.t_fp < base.forward_saved(np.array([0] * 7 + [1], bool))
    assert corrected.predicted_ratio(mask) == pytest.approx(measured, rel=1e-3)
    assert corrected.predicted_ratio(mask) < before
    importance = np.where(mask, 1.0, 0.0)
    assert corrected.select(importance, measured * 1.001, resolution=100000)[mask].all()
    assert corrected.rho_floor >= 0.0


def test_a_cut_is_priced_by_the_traced_forward_time_of_its_prefixs_layers():
    # The traced forward: augmentation (no FLOPs, 2 ms) and a costly early layer before cut
    # "low", whose FLOP estimate (CACHE's shares) says it saves 30% of the forward, the trace
    # 50%; cut "high": 75% and 70%.  A cut's share is the mean of the two.
    layers = {"augment": 2.0, "early": 3.0, "mid": 2.0, "late": 2.0}  # + 1 ms of loss ops
    table = dict(chain_table(), t_fp_layers_ms=layers, t_fp_ops_ms=10.0)
    cache = {"cuts": [dict(CACHE["cuts"][0], prefix_layers=["augment", "early"]),
                      dict(CACHE["cuts"][1], prefix_layers=["augment", "early", "mid"])],
             "layers": list(layers), "tensor_cut": CACHE["tensor_cut"]}
    fp, full = table["t_fp_ms"], table["t_full_ms"]
    traced, plain = TimeModel(table, cache=cache), TimeModel(table)
    assert traced.prefix_shares(cache) == pytest.approx([0.4, 0.725])
    high = np.array([0, 0, 0, 0, 0, 0, 1, 1], bool)
    low = np.array([0, 0, 0, 1, 0, 0, 0, 1], bool)
    assert traced.forward_saved(high) == pytest.approx(0.725 * fp - 0.2)
    assert traced.forward_saved(low) == pytest.approx(0.4 * fp - 0.5)
    assert traced.predicted_ratio(low) == pytest.approx(
        plain.predicted_ratio(low) - (0.4 * fp - 0.5) / full)
    assert traced.predicted_ratio(np.ones(8, bool)) == pytest.approx(1.0)
    # an older table (no traced layers), or one whose layers this model does not have, keeps
    # the FLOP estimates
    for other in (chain_table(), dict(table, t_fp_layers_ms={"conv2d_7": 9.0})):
        assert TimeModel(other, cache=cache).forward_saved(low) == pytest.approx(0.3 * fp - 0.5)
