"""The profiler without profiling: a trace file's op times read, the calibration's fits on
known numbers, and profiler.py's one-line errors (its entry point, called in this process)."""
import numpy as np
import pytest

from elastictrainer.method import time_model
from elastictrainer.profiler import calibration, run as prun, trace
from elastictrainer.profiler.phases import Phases, phases_text
from helpers import script_cli


# ----------------------------------------------------------------- xplane reading
def _xspace(tmp_path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.stat_metadata[1].id = 1
    host.stat_metadata[1].name = "tf_op"
    line = host.lines.add(name="tf_Compute/1")
    for mid, name in ((1, "gradient_tape/a/MatMul:_MklMatMul"), (2, "step"),
                      (3, "fn:StatefulPartitionedCall"), (4, "gpu_op:MatMul")):
        host.event_metadata[mid].id = mid
        host.event_metadata[mid].name = name
    for mid, dur in ((1, 2_000_000_000), (1, 1_000_000_000), (2, 9e9), (3, 9e9), (4, 5e8)):
        line.events.add(metadata_id=mid, duration_ps=int(dur))
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata[7].id = 7
    gpu.stat_metadata[7].name = "tf_op"
    gline = gpu.lines.add(name="Stream #1")
    gpu.event_metadata[1].id = 1
    gpu.event_metadata[1].name = "volta_sgemm"
    ev = gline.events.add(metadata_id=1, duration_ps=4_000_000_000)
    ev.stats.add(metadata_id=7, str_value="gpu_op:MatMul")
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return str(path)


def test_read_op_times_host_and_device(tmp_path):
    times, kinds = trace.read_op_times(_xspace(tmp_path))
    assert times["gradient_tape/a/MatMul"] == pytest.approx(3.0)
    assert kinds["gradient_tape/a/MatMul"] == "_MklMatMul"
    assert "step" not in times and "fn" not in times  # not ops / call wrappers
    assert times["gpu_op"] == pytest.approx(4.0)  # device kernel time replaces the launch


# ----------------------------------------------------------------- the CLI
# An unknown model is found after TensorFlow started: tests/e2e/test_errors.py runs that one as
# `python profiler.py`.
@pytest.mark.parametrize("args,needle", [
    (["--batch_size", "0"], "batch_size"),
    (["--batch_size", "four"], "invalid int"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle, capsys, monkeypatch):
    """profiler.py's entry point, in this process: one stderr line, exit code 2."""
    # input let through would profile ResNet-50: stop at the profiling itself
    monkeypatch.setattr(prun, "profile_configuration", lambda *a, **kw: pytest.fail("went on"))
    code, _, err = script_cli("profiler", args, capsys)
    assert code == 2 and len(err) == 1 and needle in err[0], err


# ------------------------------------------------------------------------------ calibration
def _naive_constrained_fit(t_dw, t_dy, rank, t_fp, t_full, measured):
    """Brute force over a fine grid of a (b follows from the full-step constraint)."""
    dw_all, dy_all = sum(t_dw), sum(t_dy)
    budget = t_full - t_fp
    best = None
    for a in np.linspace(0, budget / dw_all, 20001):
        b = (budget - a * dw_all) / dy_all
        err = 0.0
        for mask, ratio in measured.values():
            deepest = max(r for r, m in zip(rank, mask) if m)
            dw = sum(t for t, m in zip(t_dw, mask) if m)
            dy = sum(t for t, r in zip(t_dy, rank) if r <= deepest)
            err += ((t_fp + a * dw + b * dy) / t_full - ratio) ** 2
        if best is None or err < best[0]:
            best = (err, a, b)
    return best[1], best[2]


def test_calibration_recovers_known_overlap_and_matches_naive_fit():
    rng = np.random.default_rng(1)
    n = 30
    t_dw, t_dy = rng.uniform(0.5, 3, n), rng.uniform(0.2, 2, n)
    rank = rng.permutation(n)
    t_fp = 20.0
    a_true = 0.4  # weight-gradient ops mostly hidden behind the error-gradient chain
    b_true = (60.0 - a_true * t_dw.sum()) / t_dy.sum()
    t_full = t_fp + 60.0
    refs = calibration.reference_selections(rank)
    assert set(refs) == {"output_only", "dy_to_input", "dy_to_half", "all_to_half"}
    assert refs["output_only"][np.argmin(rank)] and refs["output_only"].sum() == 1
    assert refs["dy_to_input"][np.argmax(rank)] and refs["dy_to_input"].sum() == 1

    def true_ratio(mask):
        dw, dy = time_model.selection_sums(t_dw, t_dy, rank, mask)
        return (t_fp + a_true * dw + b_true * dy) / t_full

    exact = {k: (m, true_ratio(m)) for k, m in refs.items()}
    a, b = calibration.fit_calibration(t_dw, t_dy, rank, t_fp, t_full, exact)
    assert (a, b) == pytest.approx((a_true, b_true), rel=1e-9)
    noisy = {k: (m, r * rng.uniform(0.95, 1.05)) for k, (m, r) in exact.items()}
    a, b = calibration.fit_calibration(t_dw, t_dy, rank, t_fp, t_full, noisy)
    na, nb = _naive_constrained_fit(t_dw, t_dy, rank, t_fp, t_full, noisy)
    grid = (t_full - t_fp) / t_dw.sum() / 20000  # the naive fit's resolution
    assert a == pytest.approx(na, abs=2 * grid) and b == pytest.approx(nb, rel=1e-3)
    # training everything still predicts the full step exactly
    assert t_fp + a * t_dw.sum() + b * t_dy.sum() == pytest.approx(t_full)


def test_fixed_cost_fit_recovers_an_offset_and_falls_back_without_one():
    """fit_fixed_cost finds the per-step cost that partial steps pay beyond their ops (an
    offset of every partial selection's ratio), keeps the full step exact, and gives
    fit_calibration's scales with c = 0 when the measurements show no such cost."""
    rng = np.random.default_rng(2)
    n = 30
    t_dw, t_dy = rng.uniform(0.5, 3, n), rng.uniform(0.2, 2, n)
    rank = rng.permutation(n)
    t_fp, t_full, c_true, a_true = 20.0, 80.0, 6.0, 0.4
    refs = calibration.reference_selections(rank)

    def measured_with(c):
        """Each reference's ratio for a fixed cost c, with the t_dy scale that keeps the full
        step exact; and that scale."""
        b = (t_full - t_fp - c - a_true * t_dw.sum()) / t_dy.sum()
        ratios = {}
        for k, m in refs.items():
            dw, dy = time_model.selection_sums(t_dw, t_dy, rank, m)
            ratios[k] = (m, (t_fp + c + a_true * dw + b * dy) / t_full)
        return ratios, b

    with_cost, b_true = measured_with(c_true)
    a, b, c = calibration.fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, with_cost)
    assert (a, b, c) == pytest.approx((a_true, b_true, c_true), rel=1e-9)
    assert t_fp + c + a * t_dw.sum() + b * t_dy.sum() == pytest.approx(t_full)
    # the same ratios without the offset: no fixed cost, the two-scale fit exactly
    exact, _ = measured_with(0.0)
    a, b, c = calibration.fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, exact)
    assert c == 0.0 and (a, b) == calibration.fit_calibration(t_dw, t_dy, rank, t_fp, t_full,
                                                               exact)
    # partial steps cheaper than the ops say (the forward pass timed alone costs more than it
    # does in a step): a negative offset, recovered as long as it leaves the forward pass at
    # least MIN_FORWARD_SHARE of its timed cost; beyond that, c = 0
    cheaper, b_neg = measured_with(-6.0)
    assert calibration.fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, cheaper) == pytest.approx(
        (a_true, b_neg, -6.0), rel=1e-9)
    too_cheap, _ = measured_with(-(1 - calibration.MIN_FORWARD_SHARE) * t_fp - 1.0)
    assert calibration.fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, too_cheap)[2] == 0.0
    # the time model adds it to the forward pass
    table = {"tensors": [{"rank": int(r), "t_dw_ms": float(w), "t_dy_ms": float(y)}
                         for r, w, y in zip(rank, t_dw, t_dy)],
             "t_fp_ms": t_fp, "t_full_ms": t_full,
             "calibration": {"dw_scale": a_true, "dy_scale": b_true, "fixed_ms": c_true}}
    tm = time_model.TimeModel(table)
    for m, r in with_cost.values():
        assert tm.predicted_ratio(m) == pytest.approx(r)
    assert tm.predicted_ratio(np.ones(n, bool)) == pytest.approx(1.0)


def test_calibration_clips_to_non_negative_scales_and_falls_back_to_uniform():
    t_dw, t_dy, rank = np.ones(4), np.ones(4), np.arange(4)
    # a measured ratio far above anything reachable pushes a below zero: clipped
    mask = np.array([0, 0, 0, 1], bool)
    a, b = calibration.fit_calibration(t_dw, t_dy, rank, 2.0, 10.0, {"x": (mask, 5.0)})
    assert a == 0.0 and b == pytest.approx(8.0 / 4)
    assert calibration.fit_calibration(t_dw, t_dy, rank, 2.0, 10.0, {}) == (1.0, 1.0)
    assert calibration.fit_calibration(t_dw, np.zeros(4), rank, 2.0, 10.0, {"x": (mask, 0.5)}) == (2.0, 2.0)
    # a at its upper bound: b must be exactly 0, not the -9e-16 that rounding leaves (load_table
    # refuses a negative scale; TF 2.16's timings reach this case)
    t_fp, t_dw3 = 2.8000000000000016, np.full(3, 0.1)
    a, b = calibration.fit_calibration(t_dw3, np.ones(3), np.arange(3), t_fp, 10.0,
                                       {"x": (np.array([1, 0, 1], bool), 0.5)})
    assert a == (10.0 - t_fp) / t_dw3.sum() and b == 0.0


# ------------------------------------------------------------------------------ phases
def test_phases_book_the_time_between_marks_and_add_up_repeats():
    readings = iter([0.0, 1.0, 1.5, 4.0, 4.25, 10.0])
    ph = Phases(clock=lambda: next(readings))
    for name in ("build", "warmup", "steps", "warmup", "profile"):
        ph.mark(name)
    assert ph.seconds == {"build": 1.0, "warmup": 0.75, "steps": 2.5, "profile": 5.75}
    ph.split("profile", {"trace": 3.0, "parse": 2.0})  # a nested ledger's phases
    assert ph.seconds == {"build": 1.0, "warmup": 0.75, "steps": 2.5, "trace": 3.0,
                          "parse": 2.0, "profile_other": 0.75}


def test_phases_text_gives_the_total_and_the_largest_first():
    line = phases_text({"child_start": 2.5, "trace_compile": 4.0, "setup": 0.01}, "in a child")
    assert line == "profiled in a child in 6.5 s: trace compile 4.0 s, child start 2.5 s"
    assert phases_text(None, "in this process") == "profiled in this process"


def test_timed_repeats_settle_only_when_every_series_agrees_after_the_minimum():
    from elastictrainer.profiler.calibration import settled

    steady, noisy = [100.0, 103.0, 98.0], [100.0, 130.0, 98.0]
    assert settled([steady, [0.5, 0.51, 0.5]], min_rounds=3, spread=0.08)
    assert not settled([steady[:2]], min_rounds=3, spread=0.08)  # too few rounds yet
    assert not settled([steady, noisy], min_rounds=3, spread=0.08)  # one series disagrees
    assert not settled([[0.0, 0.0, 0.0]], min_rounds=3, spread=0.08)
    # a loaded machine's rounds run to the maximum: the caller stops at its own count
    assert settled([noisy + [101.0, 99.0]], min_rounds=3, spread=0.4)


def test_forward_ops_are_charged_to_the_innermost_layer_of_their_name():
    from elastictrainer.profiler.attribution import forward_by_layer

    class Info:  # the dataflow's verdict on each op name: only forward ops count
        def lookup(self, name):
            return ("backward" if name.startswith("gradient_tape") else "forward"), 0

    ops = {"m/augment_rotation/transform/ImageProjectiveTransformV3": 6.0,
           "m/backbone/block_1/Conv2D": 4.0, "m/backbone/block_1/Relu": 2.0,
           "m/backbone_1/block_2_1/Conv2D": 8.0,  # scopes made unique by TensorFlow
           "m/sparse_categorical_crossentropy/Sum": 1.0,  # no layer's
           "gradient_tape/m/backbone/block_1/Conv2DBackpropFilter": 50.0}
    got = forward_by_layer(Info(), ops, 2, ["augment_rotation", "block_1", "block_2"])
    assert got == pytest.approx({"augment_rotation": 3.0, "block_1": 3.0, "block_2": 4.0})
    # Keras 3's scopes: every layer's name with a suffix, even where another layer has the
    # suffixed name
    keras3 = {"m/conv2d_1/convolution": 4.0, "m/conv2d_1_1/convolution": 6.0,
              "m/random_flip_1/stateless_random_flip_left_right": 2.0}
    assert forward_by_layer(Info(), keras3, 1, ["conv2d", "conv2d_1", "random_flip"],
                            suffixed=True) == pytest.approx(
        {"conv2d": 4.0, "conv2d_1": 6.0, "random_flip": 2.0})


def test_a_table_without_traced_forward_layers_reads_and_a_bad_one_does_not(tmp_path):
    import json

    from elastictrainer.errors import UserError
    from elastictrainer.profiler import table as tables

    old = {"model": "m", "input_size": 8, "batch_size": 2, "num_classes": 2, "t_fp_ms": 1.0,
           "t_full_ms": 3.0, "t_bp_ms": 2.0, "coverage": 1.0, "unattributed": [],
           "tensors": [{"name": "w", "rank": 0, "t_dw_ms": 1.0, "t_dy_ms": 1.0}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(old))
    assert tables.load_table(str(path))["t_fp_layers_ms"] is None
    path.write_text(json.dumps(dict(old, t_fp_layers_ms={"a": 1.5})))
    assert tables.load_table(str(path))["t_fp_layers_ms"] == {"a": 1.5}
    path.write_text(json.dumps(dict(old, t_fp_layers_ms={"a": -1.0})))
    with pytest.raises(UserError, match="t_fp_layers_ms"):
        tables.load_table(str(path))
