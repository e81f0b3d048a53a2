"""The pace check's rule (trend.behind) and what the runtime does with its answer, on the
scripted device of test_elastic_runtime.py: under rho auto a selection whose loss falls, but
more slowly per second than full training's would, widens the run towards full training as one
whose loss did not fall; one that keeps up, and any numeric rho, are left as they are."""
import numpy as np

from elastictrainer.elastic import trend
from elastictrainer.method.time_model import TimeModel

from .test_elastic_runtime import IMPORTANCE, N, Device, drive, make, table
from .test_selection_pays import falling


def test_the_rule_asks_whether_full_training_is_faster_per_second_beyond_the_spread():
    """Per second of a full step the selection brings its drop over its step ratio: at 0.5 of
    a full step, 0.2 a step is 0.4 a full step's time, behind full training's 0.6 on every
    batch; 0.35 a step (0.7) is ahead.  A gap the batches' spread covers is not behind, nor
    are fewer than four batches."""
    full = [0.60, 0.62, 0.58, 0.61, 0.59, 0.60]
    slow, words = trend.behind(full, [0.20, 0.21, 0.19, 0.2, 0.2, 0.2], 0.5)
    assert slow and words == ("over 6 batches, a full step lowered the loss by 0.6000 and "
                              "this selection's by 0.2000 at 0.500 of its time")
    assert not trend.behind(full, [0.35] * 6, 0.5)[0]
    noisy = [1.6, -0.4, 1.5, -0.5, 1.4, -0.2]  # mean 0.567, against the selection's 0.4
    assert not trend.behind(noisy, [0.2] * 6, 0.5)[0]  # a gap of 0.167, standard error 0.41
    assert trend.behind(full[:3], [0.0] * 3, 0.5) == (False, None)
    assert trend.behind(full, [0.2] * 6, None) == (False, None)


def _pace_run(rho, behind, loss=falling, check=True):
    """An 800-step run, re-selected every 100, whose pace check answers `behind` (full
    training's drops 0.6 a batch against the selection's 0.05, else the same per second);
    returns (runtime, its lines, the selections the check was asked about)."""
    model = TimeModel(table())
    device = Device(model)
    asked, said = [], []

    def pace(selection):
        asked.append(tuple(selection))
        ratio = model.predicted_ratio(np.isin(np.arange(N), selection))
        full = 0.6 + 0.01 * np.sin(np.arange(8))
        return full, (np.full(8, 0.05) if behind else full * ratio)

    rt = make(model, device, rho=rho, total=800, steps_per_epoch=100, interval=1, share=0.7,
              log=said.append, pace=pace if check else None)
    drive(rt, device, 800, IMPORTANCE, loss=loss)
    return rt, said, asked


def test_under_rho_auto_a_selection_behind_full_trainings_pace_widens_the_run():
    """The loss falls every interval (the trend alone widens nothing), but the check finds
    the selection behind: the run widens at the first judged re-selection, says why in one
    line, and ends training every tensor; the check was asked about the selection that had
    trained, and is not asked again once every tensor trains."""
    rt, said, asked = _pace_run("auto", behind=True)
    picks = [r for r in rt.records if r.reason.startswith("interval")]
    assert asked[0] == tuple(np.nonzero(picks[0].mask)[0])
    widened = [line for line in said if "rho auto widens towards full training" in line]
    assert widened and widened[0].startswith("elastic: step 101: it trains more slowly than "
                                             "full training (over 8 batches")
    assert any("pace check" in line and line.endswith(": behind full training")
               for line in said)
    assert all(picks[-1].mask) and rt.state()["min_ratio"] > 0
    found = picks[0].pace  # what the check found is the checked selection's record's
    assert (found["step"], found["batches"], found["behind"]) == (100, 8, True)
    assert found["full_drop"] == np.mean(0.6 + 0.01 * np.sin(np.arange(8)))
    assert found["drop"] == 0.05 and found["ratio"] > 0
    assert len(asked) < sum(r.step > 0 for r in rt.records) + 1
    assert not any(all(np.isin(np.arange(N), a)) for a in asked)


def test_a_selection_that_keeps_up_and_a_numeric_rho_are_left_alone():
    """A selection as fast per second as full training is kept as without the check (the
    same selections), saying it keeps up; a numeric rho (the user's budget) never asks."""
    kept, said, asked = _pace_run("auto", behind=False)
    plain, _, _ = _pace_run("auto", behind=False, check=False)
    assert asked and kept.state()["min_ratio"] == 0
    assert any(line.endswith(": keeping up") for line in said)
    assert [r.pace["behind"] for r in kept.records if r.pace] == [False] * len(asked)
    assert [r.mask for r in kept.records] == [r.mask for r in plain.records]
    fixed, fixed_said, fixed_asked = _pace_run(0.6, behind=True)
    assert fixed_asked == [] and fixed.state()["min_ratio"] == 0


def test_a_run_resumed_between_the_check_and_the_solve_still_widens():
    """The check runs before the probes; a run checkpointed after it, while the probes of
    that re-selection are still to come (two probe batches), widens once resumed."""
    model = TimeModel(table())
    device = Device(model)

    def pace(selection):
        return np.full(8, 0.6), np.full(8, 0.05)

    def runtime(said):
        return make(model, device, rho="auto", total=800, steps_per_epoch=100, interval=1,
                    share=0.7, log=said.append, pace=pace)

    first, said = runtime([]), []
    drive(first, device, 100, IMPORTANCE, loss=falling)
    assert first.reselect_due(100)
    first.begin_reselection(100, probes=2)
    assert first.step_kind() == "probe"
    first.step_done(100, "probe", 0.1, terms=IMPORTANCE)
    resumed = runtime(said)
    resumed.load_state(first.state())
    assert resumed.step_kind() == "probe"
    resumed.step_done(101, "probe", 0.1, terms=IMPORTANCE)
    assert any("rho auto widens towards full training" in line for line in said)
    assert resumed.state()["min_ratio"] > 0
