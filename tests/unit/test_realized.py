"""elastic/realized.py: the depth groups, the estimate scaled by each group's realized share,
and the run's check through a scripted trial step."""
import numpy as np
import pytest

from elastictrainer.elastic import realized
from elastictrainer.elastic.runtime import ElasticRuntime
from elastictrainer.method.time_model import TimeModel


def test_groups_split_the_tensors_by_depth_in_nearly_equal_runs():
    assert realized.groups(10, 4) == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    assert realized.groups(3, 4) == [[0], [1], [2]]  # fewer tensors than groups
    many = realized.groups(158)
    assert len(many) == realized.GROUPS and {len(g) for g in many} == {9, 10}
    assert sum(many, []) == list(range(158))
    masks = realized.masks(40)
    assert len(masks) == realized.GROUPS and np.sum(masks, axis=0).tolist() == [1] * 40


def test_each_groups_positive_estimates_scale_by_its_realized_share():
    importance = np.array([1.0, 0.5, 0.2, -0.1, 0.3, 0.4, 0.1, 0.2])
    # shares: 10%, -50% (the step raised the held-out loss), prediction not positive, 100%
    measured = [(2.0, 0.2), (1.0, -0.5), (0.0, 0.3), (4.0, 4.0)]
    out, shares, words = realized.correct(importance, measured, parts=4)
    assert shares[2] is None and [shares[k] for k in (0, 1, 3)] == pytest.approx([0.1, -0.5, 1])
    np.testing.assert_allclose(out, [0.1, 0.05, -0.1, -0.1, 0.3, 0.4, 0.1, 0.2])
    assert "+10% | -50% | - | +100%" in words and "scaled by depth" in words


def test_when_no_group_lowers_the_loss_the_estimate_stands():
    importance = np.array([1.0, 0.5, 0.2, 0.1])
    out, _, words = realized.correct(importance, [(1, -1), (1, -0.1), (0.5, 0), (1, -2)],
                                     parts=4)
    np.testing.assert_array_equal(out, importance)
    assert "estimate kept" in words


def _runtime(trial, lines):
    n = 8
    table = {"t_fp_ms": 30.0, "t_full_ms": 100.0,
             "tensors": [{"name": f"t{k}", "rank": n - 1 - k, "t_dw_ms": 35.0 / n,
                          "t_dy_ms": 35.0 / n}
                         for k in range(n)]}
    return ElasticRuntime(TimeModel(table), "auto", steps_per_epoch=10, total_steps=100,
                          interval=1.0, economy=False, feedback=False, trial=trial,
                          clock=lambda: 0.0, log=lines.append)


def test_the_run_selects_on_the_checked_estimate():
    asked = []

    def trial(masks, enough):  # the steps of the lowest four tensors raise the loss
        asked.append(masks)
        pairs = [(1.0, -0.2) if mask.index(1) < 4 else (1.0, 0.5) for mask in masks]
        assert enough(pairs)  # the upper groups realize half their promise: no backtracking
        return pairs, False

    lines = []
    rt = _runtime(trial, lines)
    assert rt.reselect_due(0)
    rt.begin_reselection(0, probes=1)
    assert rt.step_kind() == "probe"
    # eq. 4-6 ranks the lowest tensors first
    rt.step_done(0, "probe", 0.1, terms=[8.0, 7, 6, 5, 1, 1, 1, 1])
    assert asked == [realized.masks(8)]
    assert rt.selection and min(rt.selection) >= 4  # the lowest groups left out
    assert any(line.startswith("elastic: trial step by depth") for line in lines)


def test_without_a_held_batch_the_estimate_is_used_as_it_is():
    lines = []
    rt = _runtime(lambda masks, enough: (None, False), lines)
    rt.reselect_due(0)
    rt.begin_reselection(0, probes=1)
    rt.step_done(0, "probe", 0.1, terms=[8.0, 7, 6, 5, 1, 1, 1, 1])
    assert 0 in rt.selection
    assert not any("trial step" in line for line in lines)


def test_where_every_depth_overshoots_the_check_backtracks_to_the_plain_step():
    """The momentum-long step realizes a few percent at every depth, noise about zero: the
    shares come from the plain step on the same batches, whose shares tell the depths apart
    (8 tensors: a group each)."""
    importance = np.array([8.0, 7, 6, 5, 1, 1, 1, 1])
    stretched = [(1.0, r) for r in (0.04, -0.03, 0.02, 0.01, 0.03, -0.02, 0.04, 0.01)]
    plain = [(0.1, r) for r in (-0.01, -0.01, -0.01, -0.01, 0.09, 0.09, 0.09, 0.09)]
    assert not realized.enough(stretched) and realized.enough(plain)

    def trial(masks, enough):  # as TrialStep.drops: the plain step when the rule refuses
        assert len(masks) == 8
        return (stretched, False) if enough(stretched) else (plain, True)

    out, words = realized.checked(trial, importance)
    np.testing.assert_allclose(out, [-0.8, -0.7, -0.6, -0.5, 0.9, 0.9, 0.9, 0.9])
    assert "the plain step's" in words
    # a stretched step some depth realizes half of: its shares stand, no plain step
    fine = [(1.0, r) for r in (-0.2, -0.2, 0.1, 0.1, 0.6, 0.6, 0.9, 0.9)]
    out, words = realized.checked(lambda masks, enough: (fine, not enough(fine)), importance)
    np.testing.assert_allclose(out[6:], [0.9, 0.9])
    assert "plain" not in words
