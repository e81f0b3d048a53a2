"""The economy (elastic/economy.py) on scripted step times and a fake clock: the same decision
at the start whether or not the timing table has a compile time, what it tells summary.json
and the closing line, and the step ratio every run reports."""
import numpy as np
import pytest

from elastictrainer.elastic import SHORT_RUN, STATE_VERSION, ElasticState
from elastictrainer.elastic import economy as economy_mod
from elastictrainer.elastic.prices import COMPILE_MS_PER_TENSOR
from elastictrainer.elastic.rho_control import MEASURE_STEPS, RECHECK_STEPS
from elastictrainer.method.time_model import TimeModel

from .test_elastic_runtime import (IMPORTANCE, N, Device, _shifting_importance, drive,
                                   full_training_seconds, make, table)


def fast_table(scale=0.02):
    """table()'s tensors at `scale` of their times: a full step of about a millisecond, so that
    a compile is hundreds of steps, as for a small CNN on a CPU."""
    out = table()
    for t in out["tensors"]:
        t["t_dw_ms"] *= scale
        t["t_dy_ms"] *= scale
    out["t_fp_ms"] *= scale
    out["t_full_ms"] *= scale
    return out


def size_estimate_s():
    return N * COMPILE_MS_PER_TENSOR / 1e3


def steps_that_pay(model, rho):
    """The run length from which the size estimate's compile pays at rho (probes left out)."""
    return economy_mod.PAYOFF * size_estimate_s() / ((1 - rho) * model.t_full / 1e3)


@pytest.mark.parametrize("feedback", [True, False])
def test_a_short_run_without_compile_ms_is_full_training_from_step_0_and_says_so(feedback):
    """A table without compile_ms (profiled uncalibrated): the compile is estimated from the
    model's size before the first step, and a run too short to pay for it trains every tensor
    with full training's step from step 0, never probes, and says so at the start, in
    summary.json's economy and in the closing line."""
    model = TimeModel(fast_table())
    total = int(0.5 * steps_that_pay(model, 0.6))
    assert total > 100  # a run of a few hundred steps
    said = []
    device = Device(model, compile_s=size_estimate_s())
    rt = make(model, device, total=total, steps_per_epoch=total, interval=1, feedback=feedback,
              log=said.append)
    rt.plan()
    kinds = drive(rt, device, total, IMPORTANCE)
    assert set(kinds) == {"selection"} and rt.selection == tuple(range(N))
    assert [r.reason for r in rt.records] == [SHORT_RUN]
    assert device.compiled == {tuple(range(N))}  # full training's step, and nothing else
    assert device.now == pytest.approx(full_training_seconds(device, total), rel=1e-12)
    start = [line for line in said if "training all tensors" in line]
    assert len(start) == 1 and "model's size" in start[0]
    result = rt.finish(device.now)
    assert result.economy["choice"] == economy_mod.FULL_TRAINING
    assert "model's size" in result.economy["compile_from"]
    assert result.economy["compile_s"] == pytest.approx(size_estimate_s())
    assert result.closing.startswith("every tensor trained, as in full training")
    assert result.summary_fields()["economy"] == result.economy
    assert result.wall_ratio == pytest.approx(1.0, rel=1e-9)


def test_a_short_run_longer_than_a_recheck_stays_full_training_to_its_end():
    """A run that the start made full training, with more steps than a selection trains before
    its ratio is measured again: full training's step throughout, no timed full step (which
    would skip a batch) and no correction (there is nothing to select from), as fast as full
    training."""
    model = TimeModel(fast_table())
    total = int(0.9 * steps_that_pay(model, 0.7))
    assert total > RECHECK_STEPS + 2 * MEASURE_STEPS
    device = Device(model, compile_s=size_estimate_s())
    rt = make(model, device, rho=0.7, total=total, steps_per_epoch=total // 4, interval=1)
    rt.plan()
    kinds = drive(rt, device, total, IMPORTANCE)
    assert set(kinds) == {"selection"} and rt.selection == tuple(range(N))
    assert [r.reason for r in rt.records] == [SHORT_RUN] and rt.corrections == ()
    assert device.now == pytest.approx(full_training_seconds(device, total), rel=1e-12)


def test_its_lines_name_the_switch_as_the_runs_user_spells_it():
    """The command line's user turns the economy off with --economy false, model.fit's with
    ElasticCallback(economy=False): each run's lines say its own."""
    model = TimeModel(fast_table())
    total = int(0.5 * steps_that_pay(model, 0.6))
    for words in (economy_mod.ECONOMY_OFF, "economy=False"):
        said = []
        rt = make(model, Device(model), total=total, steps_per_epoch=total, interval=1,
                  economy_off_words=words, log=said.append)
        rt.plan()
        assert f"({words} to select anyway)" in said[-1]
        assert rt.finish(0.0).closing.endswith(f"({words} to select anyway)")
    off = make(model, Device(model), economy=False, economy_off_words="economy=False")
    off.plan()
    assert off.finish(0.0).economy["why"].startswith("economy=False: re-selects")


@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("fraction", [0.5, 4.0])
def test_the_start_decides_the_same_with_or_without_the_tables_compile(feedback, fraction):
    """Runs below and above the length that pays for a compile: with compile_ms equal to the
    size estimate, and without any, the run takes the same steps and the same selections."""
    model = TimeModel(fast_table())
    total = int(fraction * steps_that_pay(model, 0.6))
    runs = []
    for compile_ms in (None, 1e3 * size_estimate_s()):
        device = Device(model, compile_s=size_estimate_s())
        rt = make(model, device, total=total, steps_per_epoch=max(total // 4, 1), interval=1,
                  feedback=feedback, compile_ms=compile_ms)
        rt.plan()
        kinds = drive(rt, device, total, _shifting_importance)
        runs.append((kinds, [(r.mask, r.reason) for r in rt.records]))
    assert runs[0] == runs[1]
    assert (runs[0][1] == [([1] * N, SHORT_RUN)]) == (fraction < 1)


def test_a_short_run_that_selects_reads_its_step_ratio_out_with_a_few_full_steps():
    """A run of a few hundred steps whose compile leaves no budget for the closed loop's
    rounds of full steps: READOUT_FULL_STEPS timed full steps among its selection's first
    steps give it a measured ratio, booked as overhead within READOUT_SHARE of the run, and
    nothing is corrected on it."""
    model = TimeModel(fast_table())
    total = int(2.5 * steps_that_pay(model, 0.5))
    said = []
    device = Device(model, compile_s=size_estimate_s())
    rt = make(model, device, rho=0.5, total=total, steps_per_epoch=total, interval=1,
              log=said.append)
    rt.plan()
    kinds = drive(rt, device, total, IMPORTANCE)
    assert kinds.count("probe") == 1
    assert kinds.count("full") == economy_mod.READOUT_FULL_STEPS < economy_mod.FULL_STEPS
    # interleaved as the closed loop's: before the selection's own steps 0, 2 and 4
    assert kinds[:10] == ["probe", "selection", "full", "selection", "selection",
                                       "full", "selection", "selection", "full", "selection"]
    record, = rt.records
    mask = np.array(record.mask, bool)
    assert not mask.all()
    assert record.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-9)
    assert rt.corrections == ()
    result = rt.finish(device.now)
    assert result.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-9)
    timing = result.reselection_overhead_parts_s["timing full steps"]
    assert timing == pytest.approx(3 * model.t_full / 1e3, rel=1e-9)
    assert timing <= economy_mod.READOUT_SHARE * device.now
    assert f"measured {result.measured_ratio:.3f}" in result.closing
    assert any("timed against 3 full steps" in note for note in result.economy["held_back"])
    assert any("step ratio out" in line for line in said)


def test_a_run_too_short_for_the_readout_says_why_and_gives_the_estimate():
    """A run whose compile fills its overhead share and whose few hundred steps are too few
    for even the readout: no full step, and the closing line says why it has no measured
    ratio and gives the time model's instead (summary.json's estimated_ratio)."""
    model = TimeModel(table())
    compile_s = 10 * model.t_full / 1e3
    device = Device(model, compile_s=compile_s)
    rt = make(model, device, rho=0.5, total=80, steps_per_epoch=10, interval=1,
              compile_ms=1e3 * compile_s)
    rt.plan()
    kinds = drive(rt, device, 80, _shifting_importance)
    assert "full" not in kinds
    result = rt.finish(device.now)
    record, = rt.records
    assert result.measured_ratio is None
    assert result.estimated_ratio == pytest.approx(record.predicted_ratio)
    assert result.summary_fields()["estimated_ratio"] == result.estimated_ratio
    assert "not measured (selections from step 1 on unmeasured" in result.closing
    assert f"{result.estimated_ratio:.3f} by the time model" in result.closing
    assert result.economy["choice"] == economy_mod.SELECTIONS


def test_the_economy_off_says_so_and_measures_in_full():
    model = TimeModel(fast_table())
    device = Device(model, compile_s=size_estimate_s())
    rt = make(model, device, rho=0.5, total=300, steps_per_epoch=300, interval=1, economy=False)
    rt.plan()
    kinds = drive(rt, device, 300, IMPORTANCE)
    assert kinds.count("full") >= economy_mod.FULL_STEPS
    result = rt.finish(device.now)
    assert result.economy["on"] is False and result.economy["compile_s"] is None
    assert result.measured_ratio is not None and "economy" not in result.closing


def test_the_economys_choice_survives_a_checkpoint_and_older_states_load():
    model = TimeModel(fast_table())
    total = int(0.5 * steps_that_pay(model, 0.6))
    device = Device(model)
    rt = make(model, device, total=total, steps_per_epoch=total, interval=1)
    rt.plan()
    drive(rt, device, 10, IMPORTANCE)
    resumed = make(model, device, total=total, steps_per_epoch=total, interval=1)
    resumed.load_state(rt.state())
    resumed.plan()  # a resumed run plans again: it decides nothing new
    drive(resumed, device, total - 10, IMPORTANCE, start=10)
    assert resumed.finish(device.now).economy == rt.finish(device.now).economy
    older = ElasticState.from_dict({"version": 2, "next_reselect": 5, "measuring": True})
    assert older.version == STATE_VERSION == 5
    assert older.readout is False and older.economy == {} and older.paced is None


def test_a_switch_to_a_cheaper_selection_passes_a_spent_budget_when_it_pays_for_itself():
    """The budget is spent (ten selections compiled, a second each).  A switch to a cheaper
    selection whose shorter steps save PAYOFF times its compile and measurement over the steps
    left still compiles; one with too few steps left, and a dearer one, are held back."""
    from elastictrainer.elastic.economy import Economy, Progress
    from elastictrainer.elastic.prices import Prices
    from elastictrainer.elastic.rho_control import RhoController

    model = TimeModel(table())
    prices = Prices(True, RhoController(model, 0.5, feedback=False), total_steps=2000,
                    steps_per_epoch=100, probe_batches=1, compile_ms=1000.0)
    economy = Economy(prices, every=100, is_compiled=lambda selection: False)
    current, cheaper, dearer = (tuple(range(N - k, N)) for k in (5, 2, 7))
    mask = np.isin(np.arange(N), current)
    now = Progress(current_ratio=model.predicted_ratio(mask), selected=True,
                   selections_compiled=10)
    assert not economy.affordable(1.0, 1000, now)  # the budget alone holds every switch back
    assert economy.worth_compiling(cheaper, 1000, now)
    assert not economy.worth_compiling(cheaper, 1990, now)
    assert not economy.worth_compiling(dearer, 1000, now)
