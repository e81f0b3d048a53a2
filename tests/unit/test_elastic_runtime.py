"""The elastic runtime's decision part (elastic/runtime.py) driven by scripted step times on a
fake clock: no TensorFlow, no sleeps, no wall-clock bounds, nothing patched."""
import subprocess
import sys

import numpy as np
import pytest

from elastictrainer.elastic import (HEAD_WARMUP, SHORT_RUN, ElasticRuntime, ElasticState,
                                    STATE_VERSION)
from elastictrainer.elastic import economy as economy_mod
from elastictrainer.elastic.rho_control import FULL_STEPS, MEASURE_STEPS
from elastictrainer.method.time_model import TimeModel

N = 8


def table(n=N, forward_share=0.35, seed=0, update_share=None):
    """A timing table as the profiler writes one (the keys TimeModel reads); update_share: the
    optimizer's update's share of a full step (t_grads_ms), None: not timed."""
    rng = np.random.default_rng(seed)
    tensors = [{"name": f"t{k}", "rank": n - 1 - k, "t_dw_ms": float(rng.uniform(1, 4)),
                "t_dy_ms": float(rng.uniform(1, 4))} for k in range(n)]
    backward = sum(t["t_dw_ms"] + t["t_dy_ms"] for t in tensors)
    t_fp = forward_share / (1 - forward_share) * backward
    out = {"tensors": tensors, "t_fp_ms": t_fp, "t_full_ms": t_fp + backward}
    if update_share is not None:
        out["t_grads_ms"] = out["t_full_ms"] * (1 - update_share)
    return out


class Device:
    """Scripted step times: a selection's step costs what `truth` (a TimeModel) predicts, times
    `factor(step)`; each step function's first call adds `compile_s`; the loop spends
    `loop_s` a step outside the steps."""

    def __init__(self, truth, compile_s=0.0, loop_s=1e-3, factor=None):
        self.truth, self.compile_s, self.loop_s = truth, compile_s, loop_s
        self.factor = factor or (lambda step: 1.0)
        self.now = 0.0
        self.compiled = set()

    def clock(self):
        return self.now

    def step_seconds(self, selection, step, train=True):
        """A step of `selection`; train false: every gradient without the update (a probe's or
        a timed full step's: a function of its own), which the table's full_over_grads says
        is cheaper."""
        mask = np.zeros(len(self.truth.t_dw), bool)
        mask[list(selection)] = True
        seconds = (self.truth.t_fp + self.truth.cost_ms(mask)) / 1e3 * self.factor(step)
        if not train:
            seconds /= self.truth.full_over_grads
        key = tuple(selection) if train else "gradients"
        first = key not in self.compiled
        self.compiled.add(key)
        return seconds + (self.compile_s if first else 0.0), first


def make(model, device, rho=0.6, total=400, steps_per_epoch=100, interval=4,
         log=lambda msg: None, **kw):
    return ElasticRuntime(model, rho, steps_per_epoch=steps_per_epoch, total_steps=total,
                          interval=interval, clock=device.clock, log=log,
                          is_compiled=lambda sel: tuple(sel) in device.compiled, **kw)


def drive(rt, device, steps, importance, start=0, loss=None, ran=None):
    """The loop: what elastic/driver.py does, with the device's scripted times.  importance:
    every probe's terms, or a function of the probes run so far giving them; loss(g,
    selection): a selection step's scripted training loss (None: the driver reports none);
    ran: a list that gets each step's (kind, tensors trained).  Returns the kinds of step
    run."""
    everything = tuple(range(N))
    kinds = []
    probes = 0
    for g in range(start, start + steps):
        if rt.reselect_due(g):
            rt.begin_reselection(g, probes=1)
        kind = rt.step_kind()
        selection = everything if kind != "selection" else rt.selection
        seconds, first = device.step_seconds(selection, g, train=kind == "selection")
        device.now += seconds
        terms = None
        if kind == "probe":
            terms = importance(probes) if callable(importance) else importance
            probes += 1
        step_loss = None if loss is None or kind != "selection" else loss(g, selection)
        rt.step_done(g, kind, seconds, compiled=first, terms=terms, loss=step_loss)
        device.now += device.loop_s
        kinds.append(kind)
        if ran is not None:
            ran.append((kind, None if kind != "selection" else selection))
    return kinds


def full_training_seconds(device, steps):
    """What full training of the same steps takes on the same device."""
    full = Device(device.truth, device.compile_s, device.loop_s, device.factor)
    for g in range(steps):
        seconds, _ = full.step_seconds(tuple(range(N)), g)
        full.now += seconds + full.loop_s
    return full.now


IMPORTANCE = np.linspace(0.1, 1.0, N)  # output-most tensors most important


def test_importing_the_decision_part_starts_no_tensorflow():
    code = ("import sys, elastictrainer.elastic; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_reselection_probes_then_measures_the_selection_among_full_steps():
    """The step kinds of a re-selection: one probe step, the selection's first (compiling)
    step, then its own steps with a full step before every other one until a round of
    MEASURE_STEPS own and FULL_STEPS full steps is judged; then the selection alone."""
    model = TimeModel(table())
    device = Device(model)
    rt = make(model, device)
    kinds = drive(rt, device, 40, IMPORTANCE)
    assert kinds[:4] == ["probe", "selection", "full", "selection"]
    window = kinds[2:2 + 15]
    assert window.count("full") == FULL_STEPS
    assert window.count("selection") == MEASURE_STEPS
    assert set(kinds[17:]) == {"selection"}
    record = rt.records[0]
    mask = np.array(record.mask, bool)
    assert record.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-9)
    assert record.predicted_ratio <= 0.6 * (1 + 1e-9)
    # the most important tensors, from the output down, within the budget
    assert mask[-1] and not mask.all()


def test_each_selection_records_what_its_importance_and_its_solving_took():
    """summary.json's solve_ms and importance_ms: the solving each selection's record books
    (every record's together: the overhead's "solving" part) and its re-selection's probe
    steps.  The clock ticks a millisecond whenever it is read, so solving takes time here."""
    model = TimeModel(table())
    device = Device(model.corrected(0.8, 0.8))  # over rho at first: a correction's record too
    ticking = device.clock

    def clock():
        device.now += 1e-3
        return ticking()

    rt = ElasticRuntime(model, 0.6, steps_per_epoch=50, total_steps=400, interval=1,
                        clock=clock, log=lambda m: None,
                        is_compiled=lambda sel: tuple(sel) in device.compiled)
    probe_s = []
    original = device.step_seconds

    def step_seconds(selection, step, train=True):
        seconds, first = original(selection, step, train)
        if rt.step_kind() == "probe":
            probe_s.append(seconds)
        return seconds, first

    device.step_seconds = step_seconds
    drive(rt, device, 200, IMPORTANCE)
    records, parts = rt.records, rt.finish(1.0).reselection_overhead_parts_s
    assert any(r.reason.startswith("correction") for r in records)
    assert all(r.solve_ms > 0 for r in records)
    assert sum(r.solve_ms for r in records) == pytest.approx(parts["solving"] * 1e3, rel=1e-9)
    # one probe per re-selection: each interval's record holds its own probe's seconds
    intervals = [r for r in records if r.reason == "interval"]
    assert [r.importance_ms for r in intervals] == pytest.approx([t * 1e3 for t in probe_s])
    assert all(r.importance_ms is None for r in records if r.reason.startswith("correction"))


@pytest.mark.parametrize("in_clock", [False, True])
def test_the_runs_own_profiling_counts_against_it_in_wall_ratio(in_clock):
    """A run that profiled its timing table first waited for it, and full training would not
    have: wall_ratio is (training clock, with the profiling) over full training's time, whether
    the profiling ran inside the driver's clock (model.fit, on its first batch) or before it
    (the command line).  A resumed run adds its own profiling to the earlier processes'."""
    model = TimeModel(table())
    device = Device(model, compile_s=0.05, loop_s=2e-3)
    profiling = 3.0
    if in_clock:
        device.now += profiling  # the first batch profiles before its step
    rt = make(model, device, total=400, profiling_s=profiling, profiled_in_clock=in_clock)
    drive(rt, device, 400, IMPORTANCE)
    result = rt.finish(device.now)
    waited = device.now + (0.0 if in_clock else profiling)
    assert result.wall_ratio == pytest.approx(waited / full_training_seconds(device, 400),
                                              rel=1e-9)
    assert result.profiling_s == profiling == result.summary_fields()["profiling_s"]
    # what plot.py time needs to start the run's line after its profiling
    assert result.summary_fields()["profiling_in_train_time"] is in_clock
    assert "its 3.0 s of profiling the timing table included" in result.closing
    # without the profiling the same run is faster than full training; with it, the ratio is
    # higher by exactly the profiling over full training's time
    plain_device = Device(model, compile_s=0.05, loop_s=2e-3)
    plain = make(model, plain_device, total=400)
    drive(plain, plain_device, 400, IMPORTANCE)
    base = plain.finish(plain_device.now)
    assert base.profiling_s == 0.0 and "profiling" not in base.closing
    assert result.wall_ratio - base.wall_ratio == pytest.approx(
        profiling / full_training_seconds(device, 400), rel=1e-6)
    # resumed in a process that profiled again: both processes' profiling count
    again = make(model, device, total=400, profiling_s=1.0, profiled_in_clock=in_clock)
    again.load_state(rt.state())
    assert again.finish(device.now).profiling_s == pytest.approx(profiling + 1.0)


def test_wall_ratio_equals_full_trainings_time_on_the_same_device():
    """Compiling, loop work and re-selections included, the run's own estimate of its wall
    clock against full training's is exact when step times are steady."""
    model = TimeModel(table())
    device = Device(model, compile_s=0.05, loop_s=2e-3)
    rt = make(model, device, total=400)
    drive(rt, device, 400, IMPORTANCE)
    result = rt.finish(device.now)
    actual = device.now / full_training_seconds(device, 400)
    assert result.wall_ratio == pytest.approx(actual, rel=1e-9)
    assert result.wall_ratio < 1
    parts = result.reselection_overhead_parts_s
    # one selection compiled (the full step's compile is what full training pays too)
    assert parts["compiling"] == pytest.approx(0.05, rel=1e-9)
    assert sum(parts.values()) == pytest.approx(result.reselection_overhead_s)


def test_probe_and_full_steps_train_nothing_and_count_as_overhead():
    """Probes and timed full steps leave out the update (they must not train), so they take
    1 / full_over_grads of a full step: all of it is overhead, the measured ratio still
    compares with real full steps, and the wall ratio is still full training's exact time."""
    model = TimeModel(table(update_share=0.2))
    assert model.full_over_grads == pytest.approx(1.25)
    device = Device(model, loop_s=2e-3)
    rt = make(model, device, total=400)
    kinds = drive(rt, device, 400, IMPORTANCE)
    result = rt.finish(device.now)
    assert result.wall_ratio == pytest.approx(device.now / full_training_seconds(device, 400),
                                              rel=1e-9)
    record = rt.records[0]
    mask = np.array(record.mask, bool)
    assert record.measured_ratio == pytest.approx(model.predicted_ratio(mask), rel=1e-9)
    full_s = model.t_full / 1e3 / 1.25
    parts = result.reselection_overhead_parts_s
    assert parts["importance"] == pytest.approx(kinds.count("probe") * full_s, rel=1e-9)
    assert parts["timing full steps"] == pytest.approx(kinds.count("full") * full_s, rel=1e-9)


def test_a_wrong_table_is_corrected_after_a_confirmed_miss():
    """The device's backward ops cost 80% of the table's (a fixed cost the table missed), so
    the first selection runs over rho: confirmed over two rounds, corrected, re-solved."""
    model = TimeModel(table())
    truth = model.corrected(0.8, 0.8)
    device = Device(truth)
    rt = make(model, device, rho=0.6)
    drive(rt, device, 200, IMPORTANCE)
    (correction, *_) = rt.corrections
    assert correction.miss == "over"
    # probe, first step, two rounds of 10 own + 5 full steps
    assert correction.step == 1 + 1 + 2 * 15 - 1
    second = rt.records[1]
    assert second.reason == "correction (over rho)"
    assert second.measured_ratio <= 0.6 * 1.05


def test_a_miss_the_interval_is_too_short_to_confirm_is_said_at_the_end():
    """An interval of 24 steps: the first selection runs over rho, but its second round of
    measurement would end past the next re-selection, so no correction comes; the closing line
    says why, and that a longer interval lets the run correct.  With 100-step intervals the
    miss is corrected and nothing of the kind is said."""
    model = TimeModel(table())
    device = Device(model.corrected(0.6, 0.6))
    rt = make(model, device, rho=0.6, total=96, steps_per_epoch=24, interval=1, economy=False)
    drive(rt, device, 96, IMPORTANCE)
    result = rt.finish(10.0)
    assert not rt.corrections and result.measured_ratio > 0.6 * 1.05
    assert result.closing.endswith(
        "1 miss(es) of rho left unconfirmed: a selection stopped before the 2 rounds of 10 of "
        "its steps and 5 full steps that confirm one (a longer interval than 24 steps lets the "
        "run correct)")
    device = Device(model.corrected(0.6, 0.6))
    rt = make(model, device, rho=0.6, total=400, steps_per_epoch=100, interval=1, economy=False)
    drive(rt, device, 400, IMPORTANCE)
    assert rt.corrections and "unconfirmed" not in rt.finish(10.0).closing


def test_a_ratio_measured_only_when_a_reselection_cut_its_window_short_reaches_tensorboard():
    """12-step intervals: the selection's first window (10 of its steps and 5 full ones) never
    completes; the re-selection closes its record with what it measured, and that ratio is a
    TensorBoard point as a judged window's is."""
    from elastictrainer import runlog

    model = TimeModel(table())
    device = Device(model)
    rt = make(model, device, rho=0.6, total=48, steps_per_epoch=12, interval=1, economy=False)
    drive(rt, device, 13, IMPORTANCE)
    first = rt.records[0]
    assert first.measured_ratio == pytest.approx(model.predicted_ratio(np.array(first.mask)))
    points = [(v, step) for tag, v, step in rt.take_events() if tag == runlog.MEASURED_RATIO]
    assert points == [(first.measured_ratio, 12)]


def test_feedback_off_measures_but_never_corrects():
    model = TimeModel(table())
    device = Device(model.corrected(0.6, 0.6))
    rt = make(model, device, feedback=False)
    drive(rt, device, 200, IMPORTANCE)
    assert rt.corrections == () and len(rt.records) == 1
    assert rt.records[0].measured_ratio > 0.6 * 1.05


def test_a_run_too_short_to_pay_for_a_compile_is_full_training():
    """With a compile (the table's) worth more than the whole run could save, the runtime
    trains every tensor from the first step with full training's step and never probes: the
    run is full training, and says so; a long run with the same compile selects."""
    model = TimeModel(table())
    said = []
    short = Device(model, compile_s=3.0)
    rt = make(model, short, total=50, steps_per_epoch=50, interval=1, compile_ms=3000.0,
              log=said.append)
    rt.plan()
    kinds = drive(rt, short, 50, IMPORTANCE)
    assert set(kinds) == {"selection"} and rt.selection == tuple(range(N))
    assert [r.reason for r in rt.records] == [SHORT_RUN]
    assert any("training all tensors" in line for line in said)
    assert short.compiled == {tuple(range(N))}  # full training's step, and nothing else
    assert short.now == pytest.approx(full_training_seconds(short, 50), rel=1e-12)
    assert rt.finish(short.now).wall_ratio == pytest.approx(1.0, rel=1e-9)

    long = Device(model, compile_s=1.0)
    rt = make(model, long, total=20000, steps_per_epoch=5000, interval=4, compile_ms=1000.0)
    rt.plan()
    drive(rt, long, 300, IMPORTANCE)
    assert not all(rt.records[0].mask)
    # without the economy, the short run selects anyway
    device = Device(model, compile_s=3.0)
    rt = make(model, device, total=50, steps_per_epoch=50, interval=1, economy=False,
              compile_ms=3000.0)
    rt.plan()
    drive(rt, device, 50, IMPORTANCE)
    assert not all(rt.records[0].mask)


@pytest.mark.parametrize("compile_steps", [2, 10, 40])
@pytest.mark.parametrize("feedback", [True, False])
def test_an_elastic_run_is_never_slower_than_full_training_however_short(compile_steps,
                                                                         feedback):
    """Runs from 4 to 2000 steps, re-selecting every 10 steps, with a compile (the table's)
    of 2 to 40 full steps, each function's first call paying it: every run takes at most
    full training's time on the same device, and the longer ones well under it."""
    model = TimeModel(table())
    compile_s = compile_steps * model.t_full / 1e3
    ratios = {}
    for total in (4, 10, 30, 60, 100, 200, 500, 2000):
        device = Device(model, compile_s=compile_s, loop_s=1e-3)
        rt = make(model, device, rho=0.5, total=total, steps_per_epoch=10, interval=1,
                  feedback=feedback, compile_ms=1e3 * compile_s)
        rt.plan()
        drive(rt, device, total, _shifting_importance)
        ratios[total] = device.now / full_training_seconds(device, total)
    assert all(r <= 1 + 1e-9 for r in ratios.values()), ratios
    assert ratios[2000] < 0.65, ratios


def test_a_short_run_spends_less_on_reselecting_and_says_so():
    """A run whose one compile pays but fills its overhead share probes once, trains its
    selection on the time model's word (no full steps to measure it) and skips the later
    re-selections, saying both; a long run with the same compile measures and re-selects."""
    model = TimeModel(table())
    compile_s = 10 * model.t_full / 1e3
    said = []
    device = Device(model, compile_s=compile_s)
    rt = make(model, device, rho=0.5, total=80, steps_per_epoch=10, interval=1,
              compile_ms=1e3 * compile_s, log=said.append)
    rt.plan()
    kinds = drive(rt, device, 80, _shifting_importance)
    assert kinds.count("probe") == 1 and "full" not in kinds
    assert len(rt.records) == 1 and rt.records[0].measured_ratio is None
    assert any("unmeasured" in line for line in said)
    assert any("re-selections from step 10 on are skipped" in line for line in said)
    assert device.now < 0.75 * full_training_seconds(device, 80)

    device = Device(model, compile_s=compile_s)
    rt = make(model, device, rho=0.5, total=5000, steps_per_epoch=100, interval=1,
              compile_ms=1e3 * compile_s)
    kinds = drive(rt, device, 500, _shifting_importance)
    assert kinds.count("probe") == 5 and kinds.count("full") >= FULL_STEPS
    assert rt.records[0].measured_ratio is not None


def _shifting_importance(k):
    """The k-th re-selection's importance: worth training only a subset of the three
    output-most tensors, the 7 subsets in turn (the DP takes exactly that subset)."""
    bits = k % 7 + 1
    return np.array([0.0] * (N - 3) + [float(bits >> j & 1) for j in (2, 1, 0)])


@pytest.mark.parametrize("feedback", [True, False])
def test_reselections_keep_the_overhead_within_its_share_of_training(feedback):
    """Ten re-selections that each want another selection, each compile 1.5% of the run at
    rho: the economy switches while the overhead stays within OVERHEAD_SHARE of training, then
    keeps the selection it has (switching back to compiled ones for free); without it the
    same run spends more than that share."""
    model = TimeModel(table())
    t_sel = 0.6 * model.t_full / 1e3
    compile_s = 0.015 * 2000 * t_sel
    spent = {}
    for economy in (True, False):
        device = Device(model, compile_s=compile_s)
        rt = make(model, device, total=2000, steps_per_epoch=200, interval=1, economy=economy,
                  feedback=feedback, compile_ms=1e3 * compile_s)
        drive(rt, device, 2000, _shifting_importance)
        result = rt.finish(device.now)
        spent[economy] = result.reselection_overhead_s / device.now
        if economy:
            reasons = [r.reason for r in rt.records]
            assert "interval (kept: overhead budget)" in reasons
            assert len({tuple(r.mask) for r in rt.records}) >= 2  # it did switch, at first
    assert spent[True] <= economy_mod.OVERHEAD_SHARE
    assert spent[False] > 1.3 * economy_mod.OVERHEAD_SHARE


def test_the_tables_compile_time_decides_at_the_start_even_without_feedback():
    """A compile time the profiler measured (the table's compile_ms) is known before the first
    step: the plan says at the start that the run trains every tensor, and with
    --rho_feedback false (no decision may depend on this run's timing) too."""
    model = TimeModel(table())
    said = []
    device = Device(model, compile_s=3.0)
    rt = make(model, device, total=50, steps_per_epoch=50, interval=1, feedback=False,
              compile_ms=3000.0, log=said.append)
    rt.plan()
    assert any(line.startswith("elastic: the 50 steps would save") for line in said)
    kinds = drive(rt, device, 50, IMPORTANCE)
    assert "probe" not in kinds
    assert all(rt.records[0].mask) and rt.records[0].reason == SHORT_RUN
    # feedback off and no table value: the compile estimated from the model's size (8 tensors)
    # is paid many times over by these 50 steps, and the run selects
    device = Device(model, compile_s=3.0)
    rt = make(model, device, total=50, steps_per_epoch=50, interval=1, feedback=False)
    rt.plan()
    drive(rt, device, 50, IMPORTANCE)
    assert not all(rt.records[0].mask)


def test_a_run_that_pays_but_not_by_much_says_it_will_hold_back():
    """A compile worth more than a tenth of the run's saving (but paid for): the plan says
    re-selecting is held to its share of training."""
    model = TimeModel(table())
    said = []
    compile_s = 10 * model.t_full / 1e3
    rt = make(model, Device(model), rho=0.5, total=100, compile_ms=1e3 * compile_s,
              log=said.append)
    rt.plan()
    assert any(line.startswith("short run: 100 steps") for line in said)
    assert rt.records == ()  # it will select


def test_the_plan_gives_the_forward_floor_and_warns_near_it():
    model = TimeModel(table(forward_share=0.45))
    said = []
    rt = make(model, Device(model), rho=0.5, log=said.append)
    plan = rt.plan()
    assert plan.forward_floor == pytest.approx(model.rho_floor)
    assert plan.near_floor and any(line.startswith("warning") for line in said)
    assert 0 <= plan.affordable_tensors < N
    assert not make(model, Device(model), rho=0.9).plan().near_floor
    # a run the economy trains in full is not warned of a floor it will not select near
    said.clear()
    short = make(model, Device(model), rho=0.5, total=4, steps_per_epoch=2, compile_ms=5e3,
                 log=said.append)
    assert not short.plan().near_floor
    assert not any(line.startswith("warning") for line in said)
    assert "training all tensors" in said[-1]


@pytest.mark.parametrize("rho", [0.6, "auto"])
def test_a_run_whose_profiling_outweighs_what_it_can_save_is_told_at_its_start(rho):
    """What 400 steps save at best (the economy's best case: rho, or auto's forward floor) is
    set against the profiling this run did first: more, and the run is told it ends slower
    than full training; less, or a table read, and nothing is said."""
    model = TimeModel(table())
    saves = make(model, Device(model), rho=rho).plan().saves_at_most_s
    assert saves > 0
    for profiling, told in ((saves * 1.1, True), (saves * 0.9, False), (0.0, False)):
        said = []
        plan = make(model, Device(model), rho=rho, profiling_s=profiling,
                    log=said.append).plan()
        assert plan.profiling_s == profiling and plan.saves_at_most_s == pytest.approx(saves)
        assert any("ends slower than full training" in line for line in said) == told, said


def test_state_round_trips_and_a_resumed_runtime_decides_the_same():
    model = TimeModel(table())
    truth = model.corrected(0.6, 0.6)
    device = Device(truth)
    rt = make(model, device)
    drive(rt, device, 120, IMPORTANCE)
    saved = rt.state()
    assert saved["version"] == STATE_VERSION
    resumed_device = Device(truth)
    resumed_device.compiled = set(device.compiled)
    resumed_device.now = device.now
    resumed = make(model, resumed_device)
    resumed.load_state(saved)
    a = drive(rt, device, 150, IMPORTANCE, start=120)
    b = drive(resumed, resumed_device, 150, IMPORTANCE, start=120)
    assert a == b
    assert [r.mask for r in rt.records] == [r.mask for r in resumed.records]


@pytest.mark.parametrize("warmup", [0.0, 0.05])
@pytest.mark.parametrize("at", [3, 4, 5, 7, 12, 45])
def test_a_run_resumed_in_a_new_process_runs_the_same_kinds_of_step(at, warmup):
    """Resumed at step `at` in a process whose steps all compile again: the probes, timed full
    steps and selection steps come in the order of the run left alone (which batches train
    depends on it), and its selections are the same; the first step's compile is booked as
    compiling, not timed as a step.  With a head warm-up of 20 steps, a run killed inside it
    trains the head alone for the rest of them, then probes, as the run left alone did."""
    model = TimeModel(table())
    truth = model.corrected(0.6, 0.6)
    head = dict(head=(N - 1,), head_warmup=warmup)
    device = Device(truth)
    rt = make(model, device, **head)
    whole_ran = []
    whole = drive(rt, device, 80, IMPORTANCE, ran=whole_ran)
    device = Device(truth)
    first = make(model, device, **head)
    before_ran, after_ran = [], []
    before = drive(first, device, at, IMPORTANCE, ran=before_ran)
    saved = first.state()
    resumed_device = Device(truth)  # nothing compiled in this process yet
    resumed_device.now = device.now
    resumed = make(model, resumed_device, **head)
    resumed.load_state(saved)
    after = drive(resumed, resumed_device, 80 - at, IMPORTANCE, start=at, ran=after_ran)
    assert before + after == whole and before_ran + after_ran == whole_ran
    assert [r.mask for r in resumed.records] == [r.mask for r in rt.records]
    if warmup:
        assert whole_ran[:20] == [("selection", (N - 1,))] * 20 and whole[20] == "probe"
        assert resumed.records[0].reason == HEAD_WARMUP and resumed.records[0].steps == 20
        assert resumed.finish(resumed_device.now).closing.endswith("head warm-up: 20 steps")


def test_a_resumed_run_says_its_floor_comes_from_the_corrected_time_model():
    """A run that corrected its time model and was resumed plans with the corrected model: its
    floor differs from the fresh start's, and the line says why."""
    model = TimeModel(table())
    device = Device(model.corrected(0.6, 0.6))
    fresh_said, resumed_said = [], []
    rt = make(model, device, log=fresh_said.append)
    fresh = rt.plan()
    drive(rt, device, 120, IMPORTANCE)
    assert rt.corrections  # the device's backward pass is cheaper than the table's
    resumed = make(model, Device(model), log=resumed_said.append)
    resumed.load_state(rt.state())
    plan = resumed.plan()
    assert not fresh.corrected and plan.corrected
    assert plan.forward_floor != pytest.approx(fresh.forward_floor)
    assert "as this run's measurements corrected it" in resumed_said[0]
    assert "corrected" not in fresh_said[0]


def test_a_newer_state_is_refused():
    with pytest.raises(ValueError, match="newer"):
        ElasticState.from_dict({"version": STATE_VERSION + 1})
    assert ElasticState.from_dict({"next_reselect": 5}).version == STATE_VERSION


def test_a_correction_that_leaves_nothing_within_rho_trains_the_cheapest_tensor():
    """The device's backward ops cost a third of the table's, the rest of its full step a
    fixed cost that every step pays, so its forward floor lies far above rho: once corrected,
    no tensor fits.  The selection that opens is the cheapest (output-most) tensor, said in
    one line, never a step that trains nothing."""
    model = TimeModel(table())
    device = Device(model.corrected(1 / 3, 1 / 3))
    lines = []
    rt = make(model, device, rho=0.45, log=lines.append)
    drive(rt, device, 200, IMPORTANCE)
    assert rt.corrections, "the first selection ran over rho and was corrected"
    cheapest, empty = model.selection(np.zeros(N, bool))
    assert empty
    after = [r for r in rt.records if r.reason.startswith("correction")]
    assert after and all(np.flatnonzero(r.mask).tolist() == list(cheapest) for r in after)
    assert any("no tensor worth training fits rho" in line for line in lines)
