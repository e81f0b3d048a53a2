"""--rho auto (elastic/budget.py): each re-selection trains the cheapest selection keeping a
share of the estimated loss drop, and the closed loop holds that selection's own ratio; driven
by scripted step times on a fake clock."""
import itertools

import numpy as np
import pytest

from elastictrainer import runlog
from elastictrainer.elastic import economy as economy_mod
from elastictrainer.elastic.budget import AUTO, Budget, parse_rho
from elastictrainer.runlog import rho_text
from elastictrainer.method.cheapest import cheapest_units
from elastictrainer.method.time_model import TimeModel
from tests.unit.test_elastic_runtime import IMPORTANCE, N, Device, drive, make, table


def test_parse_and_text():
    assert parse_rho("Auto") == AUTO and parse_rho("0.4") == 0.4
    assert rho_text(AUTO) == "auto" and rho_text(0.5) == "0.5"
    assert Budget(AUTO, 0.8).text == "auto (80% of the estimated loss drop)"
    with pytest.raises(ValueError):
        Budget(AUTO, 1.5)


def test_the_time_model_picks_the_cheapest_selection_keeping_the_share():
    model = TimeModel(table())
    importance = np.array([0.05, 0.1, 0.0, 0.3, 0.2, 0.4, 0.9, 1.0])
    for share in (0.3, 0.6, 0.9, 1.0):
        mask = model.select_share(importance, share)
        assert importance[mask].sum() >= share * importance.sum() * (1 - 1e-12)
        # no selection costs less and keeps the share (exhaustive over the 2^8 masks)
        cheaper = [m for m in range(2 ** N)
                   if importance[_bits(m)].sum() >= share * importance.sum() * (1 - 1e-12)
                   and model.cost_ms(_bits(m)) < model.cost_ms(mask) - 1e-6 * model.t_full]
        assert not cheaper, (share, cheaper)
    assert cheapest_units  # the exact solver it uses is tested against brute force too


def _bits(m):
    return np.array([(m >> k) & 1 for k in range(N)], bool)


def test_a_run_holds_each_selection_to_its_own_ratio_and_records_it():
    model = TimeModel(table())
    device = Device(model)
    rt = make(model, device, rho=AUTO, share=0.7, economy=False)
    drive(rt, device, 60, IMPORTANCE)
    record = rt.records[0]
    mask = np.array(record.mask, bool)
    assert record.limited_by == "share"
    assert record.rho == pytest.approx(model.predicted_ratio(mask))
    assert IMPORTANCE[mask].sum() >= 0.7 * IMPORTANCE.sum() * (1 - 1e-12)
    # a cheaper share trains fewer tensors, a costlier one more
    low, high = (make(model, Device(model), rho=AUTO, share=s, economy=False) for s in (0.3, 1.0))
    for rt_ in (low, high):
        drive(rt_, Device(model), 10, IMPORTANCE)
    assert low.records[0].rho < record.rho < high.records[0].rho
    # the device matches the time model: measured on target, nothing corrected
    assert record.measured_ratio == pytest.approx(record.rho, rel=0.05)
    assert not rt.corrections
    events = [e for e in rt.take_events() if e[0] == runlog.SELECTION_RHO]
    assert events and events[0][1] == pytest.approx(record.rho)


@pytest.mark.parametrize("backward,miss", [(1.6, "under"), (0.6, "over")])
def test_a_selection_off_its_own_ratio_is_corrected(backward, miss):
    """The device's backward pass runs `backward` times the table's: the selection's measured
    ratio misses the ratio it was chosen at (a slower backward pass makes the forward pass a
    smaller share of a step), so the closed loop corrects the time model and re-solves; the new
    selection is held to its own ratio under the corrected model."""
    model = TimeModel(table())
    device = Device(model.corrected(backward, backward))
    logs = []
    rt = make(model, device, rho=AUTO, share=0.7, economy=False, log=logs.append)
    drive(rt, device, 200, IMPORTANCE)
    first, after = rt.records[0], rt.records[1]
    assert rt.corrections and rt.corrections[0].miss == miss
    assert rt.corrections[0].predicted_ratio_before == pytest.approx(first.rho)
    assert after.reason == f"correction ({miss} rho)" and after.rho != first.rho
    assert f"for rho {first.rho:g} (predicted" in "\n".join(logs)
    result = rt.finish(device.now)
    assert result.closing.startswith("step-time ratio asked auto (70% of the estimated loss "
                                     "drop), measured")


def test_a_fixed_rho_records_its_rho_and_resume_keeps_auto_target():
    model = TimeModel(table())
    device = Device(model)
    rt = make(model, device, rho=0.6, economy=False)
    drive(rt, device, 10, IMPORTANCE)
    assert rt.records[0].rho == 0.6
    auto = make(model, Device(model), rho=AUTO, share=0.5, economy=False)
    drive(auto, Device(model), 10, IMPORTANCE)
    again = make(model, Device(model), rho=AUTO, share=0.5, economy=False)
    again.load_state(auto.state())
    assert again.rho == pytest.approx(auto.records[-1].rho)  # the closed loop's target kept


def test_auto_prices_its_start_at_the_share_with_every_tensor_alike_not_at_the_floor():
    """Before its first selection, rho auto has no ratio of its own: the start is priced at the
    cheapest selection keeping the share when every tensor is alike in importance (checked
    against every subset), not at the forward floor, and the words say so.  A run that would
    pay for a selection at the floor but not at that estimate trains every tensor."""
    model = TimeModel(table())
    share = 0.7
    best = min(model.predicted_ratio(np.array(bits, bool))
               for bits in itertools.product((0, 1), repeat=N) if sum(bits) >= share * N)
    rt = make(model, Device(model), rho=AUTO, share=share)
    assert rt.rho == pytest.approx(best, rel=1e-9) and rt.rho > model.rho_floor + 0.1
    # 400 steps, 1 probe batch: compile priced between the two savings, over PAYOFF
    t_full_s = model.t_full / 1e3
    at_floor = (400 - 1) * (1 - model.rho_floor) * t_full_s
    at_start = (400 - 1) * (1 - best) * t_full_s
    compile_ms = 1e3 * (at_floor + at_start) / 2 / economy_mod.PAYOFF
    logs = []
    short = make(model, Device(model), rho=AUTO, share=share, total=400, log=logs.append,
                 compile_ms=compile_ms)
    short.plan()
    said = "\n".join(logs)
    assert f"at rho auto's start estimate ({best:.2f}, every tensor alike in importance)" in said
    assert "training all tensors" in said and "forward floor, " not in said
    assert short.finish(0.0).economy["choice"] == economy_mod.FULL_TRAINING
    fixed = make(model, Device(model), rho=0.6, total=4, steps_per_epoch=2, log=logs.append,
                 compile_ms=5e3)
    fixed.plan()
    assert "s at rho 0.6, not 1.5x" in logs[-1]


def _solved(model, objective, not_deepest=None):
    """What each auto objective selects on IMPORTANCE, straight from the time model."""
    if objective == "rate":
        return model.select_rate(IMPORTANCE, not_deepest=not_deepest)
    if objective == "gain":
        return model.select_gain(IMPORTANCE, not_deepest=not_deepest)
    return model.select_share(IMPORTANCE, 0.7, not_deepest=not_deepest)


@pytest.mark.parametrize("objective", ["share", "rate", "gain"])
def test_each_auto_selection_says_why_and_summary_json_keeps_it(tmp_path, objective):
    """Under any objective a selection records (and says in one line, and in TensorBoard)
    its share of the estimated loss drop, its predicted ratio and the objective's best
    selection of another deepest tensor; summary.json reads them back."""
    model = TimeModel(table())
    device = Device(model)
    logs = []
    rt = make(model, device, rho=AUTO, share=0.7, objective=objective, economy=False,
              log=logs.append)
    drive(rt, device, 10, IMPORTANCE)
    record = rt.records[0]
    mask = np.array(record.mask, bool)
    expected = _solved(model, objective)
    assert mask.tolist() == expected.tolist()
    assert record.limited_by == objective and record.objective == objective
    share = IMPORTANCE[mask].sum() / IMPORTANCE.sum()
    assert record.importance_share == pytest.approx(share)
    assert record.rate == pytest.approx(share / record.predicted_ratio)
    d = model.deepest(mask)
    other = _solved(model, objective, not_deepest=d)
    up = record.runner_up
    assert up["deepest"] == model.deepest(other) != d and up["tensors"] == int(other.sum())
    assert up["predicted_ratio"] == pytest.approx(model.predicted_ratio(other))
    assert up["importance_share"] == pytest.approx(IMPORTANCE[other].sum() / IMPORTANCE.sum())
    if objective == "rate":  # the runner-up is the worse rate, and nothing beats the choice
        assert up["rate"] <= record.rate
    elif objective == "gain":  # the runner-up gains less over full training's rate
        def gain(s, ratio):
            return s - ratio  # importance shares, full training's rate 1 per full step
        assert (gain(up["importance_share"], up["predicted_ratio"])
                <= gain(share, record.predicted_ratio) + 1e-12)
    else:  # the runner-up keeps the share too, at no lower a cost
        assert up["importance_share"] >= 0.7 * (1 - 1e-12)
        assert up["predicted_ratio"] >= record.predicted_ratio
    line = next(m for m in logs if m.startswith(f"rho auto ({objective}"))
    assert (f"{int(mask.sum())} of {N} tensors, deepest #{d} (of the trainable tensors, 0 at "
            f"the input), keep {share:.0%} of the "
            f"estimated loss drop at {record.predicted_ratio:.3f} of a full step") in line
    assert f"another deepest tensor (#{up['deepest']}, {up['tensors']} tensors)" in line
    events = {tag: value for tag, value, _ in rt.take_events()}
    assert events[runlog.SELECTION_IMPORTANCE_SHARE] == pytest.approx(share)
    assert events[runlog.RUNNER_UP_RATIO] == pytest.approx(up["predicted_ratio"])
    assert events[runlog.RUNNER_UP_IMPORTANCE_SHARE] == pytest.approx(up["importance_share"])
    summary = runlog.RunSummary(train_type="elastic_training", model="m", dataset="d",
                                rho=AUTO, seed=0, num_tensors=N, tensor_names=[], timing_table=None,
                                steps_per_epoch=100, selections=[r.to_dict() for r in rt.records])
    runlog.write_json(str(tmp_path / runlog.SUMMARY_FILE), summary.to_dict())
    back = runlog.read_summary(str(tmp_path))["selections"][0]
    assert back["objective"] == objective and back["runner_up"] == up
    assert back["importance_share"] == pytest.approx(share)
    # a numeric rho records none of it, and says no such line
    fixed_logs = []
    fixed = make(model, Device(model), rho=0.6, economy=False, log=fixed_logs.append)
    drive(fixed, Device(model), 10, IMPORTANCE)
    assert fixed.records[0].objective is None and fixed.records[0].runner_up is None
    assert not any(m.startswith("rho auto") for m in fixed_logs)


def test_the_rate_objective_is_named_in_the_budget_and_a_bad_one_is_refused():
    assert Budget(AUTO, 0.7, "rate").text == ("auto (the most estimated loss drop per second "
                                              "of step)")
    assert Budget(AUTO, 0.7, "gain").text == ("auto (the most estimated loss drop beyond full "
                                              "training's rate)")
    assert Budget(AUTO, 0.7).objective == "share"
    with pytest.raises(ValueError, match="objective"):
        Budget(AUTO, 0.7, "fastest")


def test_a_rate_run_holds_its_selection_to_its_own_ratio_and_resumes_it():
    model = TimeModel(table())
    device = Device(model)
    rt = make(model, device, rho=AUTO, objective="rate", economy=False)
    drive(rt, device, 60, IMPORTANCE)
    record = rt.records[0]
    assert record.rho == pytest.approx(record.predicted_ratio)
    assert record.measured_ratio == pytest.approx(record.rho, rel=0.05) and not rt.corrections
    assert rt.finish(device.now).closing.startswith(
        "step-time ratio asked auto (the most estimated loss drop per second of step), measured")
    again = make(model, Device(model), rho=AUTO, objective="rate", economy=False)
    again.load_state(rt.state())
    assert again.rho == pytest.approx(record.rho)
