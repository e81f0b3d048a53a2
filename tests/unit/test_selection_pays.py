"""When selections happen (elastic/runtime.py, economy.py, trend.py) on the scripted device of
test_elastic_runtime.py: a new classifier head trains alone before the first probes (the head
warm-up), and a selection whose scripted training loss stays flat is replaced at the next
interval whatever the overhead budget says, while one whose loss falls is kept under it, unless
the probes find that it holds less than half the estimated loss drop their choice holds."""
import numpy as np
import pytest

from elastictrainer.config import Config
from elastictrainer.elastic.budget import head_warmup_share
from elastictrainer.elastic import HEAD_WARMUP, trend
from elastictrainer.elastic import economy as economy_mod
from elastictrainer.experiments.protocols import OFFLINE, PAPER, SMOKE
from elastictrainer.method.time_model import TimeModel

from .test_elastic_runtime import (IMPORTANCE, N, Device, _shifting_importance, drive,
                                   full_training_seconds, make, table)

HEAD = (N - 2, N - 1)  # the output layer's kernel and bias


def test_a_head_warm_up_trains_the_head_alone_then_probes():
    """With --head_warmup 0.25 of a 100-step interval, the first 25 steps train the head
    alone (its own compiled step, unmeasured), the first probe follows them, and the warm-up
    is booked like any selection: its compile in the overhead, its steps in the wall clock,
    which stays full training's exact time on the same device; the log and the closing line
    say it."""
    model = TimeModel(table())
    device = Device(model, compile_s=0.05, loop_s=2e-3)
    said, ran = [], []
    rt = make(model, device, total=400, steps_per_epoch=100, interval=1, head=HEAD,
              head_warmup=0.25, log=said.append)
    rt.plan()
    kinds = drive(rt, device, 400, IMPORTANCE, ran=ran)
    assert ran[:25] == [("selection", HEAD)] * 25
    assert kinds[25] == "probe" and kinds.count("probe") == 4  # steps 25, 100, 200, 300
    warmup, first, *_ = rt.records
    assert (warmup.reason, warmup.step, warmup.steps, warmup.mask) == (
        HEAD_WARMUP, 0, 25, [0] * (N - 2) + [1, 1])
    assert warmup.measured_ratio is None and warmup.full_steps == 0
    assert (first.reason, first.step) == ("interval", 26) and first.measured_ratio is not None
    result = rt.finish(device.now)
    # two steps compiled: the head's and the first selection's (the later ones are the same)
    assert result.reselection_overhead_parts_s["compiling"] == pytest.approx(0.1, rel=1e-9)
    assert result.wall_ratio == pytest.approx(device.now / full_training_seconds(device, 400),
                                              rel=1e-9)
    assert any("head warm-up: the classifier head (2 tensors) trains alone for 25 steps" in line
               for line in said)
    assert result.closing.endswith("; head warm-up: 25 steps")


def test_a_head_the_probes_still_choose_alone_warms_up_for_another_round():
    """Under rho auto, first probes that find the share of the estimated loss drop in the
    head alone (its kernel, say) extend the warm-up by another 25 steps and probe again; the
    first selection follows the first probes that look past the head.  A head that holds the
    share every time warms up for the first interval at most, then is the first selection; a
    head the rate objective chooses with less than the share is the first selection at once."""
    model = TimeModel(table())
    head_first = np.array([0.01] * (N - 2) + [5.0, 0.0])  # the head's kernel alone
    runs = {}
    for rounds in (1, 9):
        device = Device(model, compile_s=0.05, loop_s=2e-3)
        said, ran = [], []
        rt = make(model, device, rho="auto", total=400, steps_per_epoch=100, interval=1,
                  head=HEAD, head_warmup=0.25, log=said.append)
        rt.plan()
        kinds = drive(rt, device, 400, lambda k: head_first if k < rounds else IMPORTANCE,
                      ran=ran)
        runs[rounds] = rt, said, ran, kinds
    rt, said, ran, kinds = runs[1]
    assert [k for k, kind in enumerate(kinds[:120]) if kind == "probe"] == [25, 51, 100]
    assert ran[26:51] == [("selection", HEAD)] * 25
    warmup, more, first, *_ = rt.records
    assert [r.reason for r in (warmup, more)] == [HEAD_WARMUP] * 2
    assert (more.step, more.steps, more.measured_ratio) == (26, 25, None)
    assert first.reason == "interval" and first.step == 52
    assert not set(np.nonzero(first.mask)[0]) <= set(HEAD)
    assert any(line.startswith("elastic: step 26: the probes find 99% of the estimated loss "
                               "drop in the classifier head alone: its warm-up goes on for 25 "
                               "more steps") for line in said)
    assert rt.finish(device.now).closing.endswith("; head warm-up: 50 steps")
    rt, said, ran, kinds = runs[9]
    # four rounds fill the first interval; the fifth probes' choice, the head's kernel, trains
    assert [r.reason for r in rt.records[:5]] == [HEAD_WARMUP] * 4 + ["interval"]
    assert rt.records[4].mask == [0] * (N - 2) + [1, 0]
    # the rate objective's choice of the head for its loss drop per second, with less than
    # the share, is its answer: the first selection, no extension
    device = Device(model, compile_s=0.05, loop_s=2e-3)
    rt = make(model, device, rho="auto", objective="rate", total=400, steps_per_epoch=100,
              interval=1, head=HEAD, head_warmup=0.25)
    drive(rt, device, 400, np.array([0.1] * (N - 2) + [1.0, 0.0]))  # the head: 62%
    warmup, first, *_ = rt.records
    assert warmup.reason == HEAD_WARMUP and (first.reason, first.step) == ("interval", 26)
    assert set(np.flatnonzero(first.mask)) <= set(HEAD)


def test_without_a_warm_up_the_run_is_todays():
    """--head_warmup 0, or a head that is every tensor, probes at step 0 and runs exactly as a
    runtime told of no head; the default warms up, and the paper's figure protocols set 0."""
    model = TimeModel(table())
    runs = []
    for head in (dict(), dict(head=HEAD, head_warmup=0.0),
                 dict(head=tuple(range(N)), head_warmup=0.25)):
        device = Device(model, compile_s=0.05)
        rt = make(model, device, total=400, steps_per_epoch=100, interval=1, **head)
        kinds = drive(rt, device, 400, _shifting_importance)
        runs.append((kinds, [r.to_dict() for r in rt.records], rt.finish(device.now).closing))
    assert runs[0] == runs[1] == runs[2] and runs[0][0][0] == "probe"
    # the default warms the head up under rho auto and keeps the paper's schedule for a rho
    assert head_warmup_share(Config().head_warmup, "auto") > 0
    assert head_warmup_share(Config().head_warmup, 0.5) == 0
    assert head_warmup_share(0.25, 0.5) == 0.25
    assert {p.flags(m)["head_warmup"] for p in (PAPER, OFFLINE, SMOKE)
            for m in ("mobilenetv2", "vit")} == {0}


def _budget_run(loss, importance=_shifting_importance):
    """test_elastic_runtime's ten re-selections each wanting an uncompiled selection, each
    compile 1.5% of the run: the overhead budget keeps the selection from step 401 on."""
    model = TimeModel(table())
    compile_s = 0.015 * 2000 * 0.6 * model.t_full / 1e3
    device = Device(model, compile_s=compile_s)
    said = []
    rt = make(model, device, total=2000, steps_per_epoch=200, interval=1,
              compile_ms=1e3 * compile_s, log=said.append)
    drive(rt, device, 2000, importance, loss=loss)
    return rt, said


def falling(g, selection):
    return 2.0 * np.exp(-(g % 200) / 300)  # each interval's selection lowers it by a third


def flat(g, selection):
    return 2.3 + 0.05 * np.sin(g)  # at chance, with batch-to-batch noise


def test_a_selection_whose_loss_stays_flat_is_replaced_past_the_overhead_budget():
    """The same run three ways: with no loss reported and with a falling loss the budget keeps
    the selection at step 401 (as before); with a flat loss the step-401 re-selection replaces
    it with the probes' choice, and the later ones re-probe past the budget too, until the
    steps left are too few to pay for a re-selection."""
    unjudged, _ = _budget_run(None)
    fell, fell_said = _budget_run(falling)
    stuck, stuck_said = _budget_run(flat)
    kept = "interval (kept: overhead budget)"
    assert [r.to_dict() for r in fell.records] == [r.to_dict() for r in unjudged.records]
    assert fell.records[2].reason == kept
    assert fell.records[2].mask == fell.records[1].mask
    assert stuck.records[2].step == 401
    assert stuck.records[2].reason == "interval (replaced: loss did not fall)"
    assert stuck.records[2].mask != stuck.records[1].mask
    assert kept not in [r.reason for r in stuck.records]
    assert sum(r.reason.startswith("interval (replaced") for r in stuck.records) >= 4
    assert any("step 800:" in line and "re-probed past the overhead budget" in line
               for line in stuck_said)


def test_the_economy_says_why_it_keeps_a_selection():
    """Each skip is one line with its reason: the budget, with the falling loss that makes
    keeping right; a flat loss with too few steps left to pay for re-selecting; and a flat
    loss whose probes choose the same tensors again."""
    _, fell_said = _budget_run(falling)
    assert any(line.startswith("elastic: step 401: the selection is kept: compiling another "
                               f"would take the re-selection overhead past "
                               f"{economy_mod.OVERHEAD_SHARE:.0%} of training, and training "
                               "loss") for line in fell_said)
    _, stuck_said = _budget_run(flat)
    assert any("step 1800:" in line and "not 2% lower, but the selection is kept: the 200 steps "
               "left are too few to pay for re-selecting" in line for line in stuck_said)
    model = TimeModel(table())
    device = Device(model)
    said = []
    rt = make(model, device, total=400, steps_per_epoch=100, interval=1, log=said.append)
    drive(rt, device, 400, IMPORTANCE, loss=flat)
    assert len({tuple(r.mask) for r in rt.records}) == 1
    assert any(line.startswith("elastic: step 101: training loss") and line.endswith(
        "not 2% lower, but the probes choose the same tensors again: the selection is kept")
        for line in said)


def test_the_rule_compares_the_thirds_of_a_selections_steps():
    """trend.verdict against its naive reference (the mean loss of the first and last third of
    the steps, by count, and the relative margin) on noisy losses that fall by 0 to 30%, in
    buckets of 1 and 3 steps; too few steps are not judged."""
    rng = np.random.default_rng(0)
    verdicts = set()
    for drop in (0.0, 0.01, 0.03, 0.3):
        losses = 2.3 * (1 - drop * np.linspace(0, 1, 300)) + rng.normal(0, 0.2, 300)
        for size in (1, 3):
            buckets = []
            for v in losses:
                trend.add(buckets, v, size)
            third = len(buckets) // 3 * size
            first, last = losses[:third].mean(), losses[-third:].mean()
            expected = not first - last > trend.FALL_MARGIN * first
            assert trend.judge(buckets)[:2] == pytest.approx((first, last), rel=1e-12)
            assert trend.verdict(trend.judge(buckets))[0] == expected
            verdicts.add(expected)
    assert verdicts == {True, False}
    assert trend.verdict(trend.judge([[2.3, 1]] * (trend.MIN_STEPS - 1))) == (False, None)
    assert trend.verdict(trend.judge([[2.3, 1]] * trend.MIN_STEPS))[0]


def _moving(k):
    """The k-th re-selection's importance: all of it on one of the three output-most tensors,
    each in turn, so that the kept selection holds none of the next estimate."""
    out = np.zeros(N)
    out[N - 1 - k % 3] = 1.0
    return out


def test_a_selection_whose_estimated_loss_drop_faded_is_replaced_past_the_budget():
    """Its loss falls, but the probes find the estimated loss drop elsewhere: at step 401,
    where the budget keeps a selection (as with a falling loss and a mild shift of importance,
    above), it is replaced by the probes' choice, with one line saying why."""
    rt, said = _budget_run(falling, _moving)
    assert rt.records[2].step == 401
    assert rt.records[2].reason == "interval (replaced: its estimated loss drop faded)"
    assert rt.records[2].mask == [0] * (N - 3) + [1, 0, 0]
    assert any("step 401: the selection keeps 0% of the estimated loss drop, the probes' "
               "choice 100%: the selection is replaced by 1 tensor past the overhead budget"
               in line for line in said)
    assert trend.faded((0, 1), (2,), [1.0, 0.0, 1.0]) is None  # half of the new one's: kept
    assert trend.faded((0,), (2,), [0.9, 0.0, 2.0]) is not None
    assert trend.faded((0,), (1,), [-1.0, -1.0, 0.0]) is None  # nothing estimated to gain


def converged(g, selection):
    return 2.0 * np.exp(-g / 30) + 0.05 + 0.005 * np.sin(g)  # down to 0.05 in the first interval


def test_under_rho_auto_a_selection_whose_loss_stays_flat_widens_the_later_ones():
    """rho auto, share 0.7, a flat loss: each re-selection may cost the failed selection's
    predicted step ratio (or the floor so far) plus half of what it saved, and takes eq. 3's
    selection under that ratio when the share's is cheaper; once that buys no other tensor,
    every tensor trains.  Each step is said in one line and the floor kept in the state; a
    falling loss widens nothing, nor one that stalls once it is under half of where the first
    selection began (converging, not failing), nor a numeric rho (the user's budget)."""
    model = TimeModel(table())
    runs = {}
    for rho, loss in (("auto", flat), ("auto", falling), (0.6, flat), ("auto", converged)):
        device = Device(model)
        said = []
        rt = make(model, device, rho=rho, total=800, steps_per_epoch=100, interval=1,
                  share=0.7, log=said.append)
        drive(rt, device, 800, IMPORTANCE, loss=loss)
        runs[rho, loss] = rt, said
    rt, said = runs["auto", flat]
    picks = [np.asarray(r.mask, bool) for r in rt.records if r.reason.startswith("interval")]
    ratios = [model.predicted_ratio(m) for m in picks]
    assert not all(picks[0]) and all(picks[-1])
    floor = 0.0
    for before, after, last, pick in zip(ratios, ratios[1:], picks, picks[1:]):
        floor = max(floor, before) + (1 - max(floor, before)) / 2  # the naive rule
        solved = model.select(IMPORTANCE, floor)
        if all(pick):  # eq. 3 under the floor buys nothing more: every tensor from here on
            assert list(solved) == list(last)
            break
        assert before < after <= floor + 1e-9 and list(pick) == list(solved)
    assert "interval (widened: every tensor)" in [r.reason for r in rt.records]
    widened = [line for line in said if "rho auto widens towards full training" in line]
    first = ratios[0] + (1 - ratios[0]) / 2
    assert len(widened) >= 2 and widened[0].startswith("elastic: step 101: training loss")
    assert widened[0].endswith(f"replaced by eq. 3's under {first:.3f} of a full step")
    assert any(f"(share 70%, widened to {first:.3f} of a full step)" in line for line in said)
    assert rt.state()["min_ratio"] > first
    converging, converging_said = runs["auto", converged]
    assert any("not 2% lower" in line for line in converging_said)  # it stalled, but low
    for key in (("auto", falling), (0.6, flat), ("auto", converged)):
        other, other_said = runs[key]
        assert other.state()["min_ratio"] == 0
        assert not any("widens" in line for line in other_said)
