"""The profiler on tiny models profiled in-process: every tensor timed and attributed, the
graph analysis, the timing table's format, calibration and fallbacks (profiler.py's own run is
e2e/test_profiler.py's, what needs no profiling unit/test_profiler.py's)."""
import json
import os

import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

from elastictrainer.train import steps as train_steps
from elastictrainer import plotting
from elastictrainer.method import time_model
from elastictrainer.profiler import attribution, calibration, dataflow
from elastictrainer.profiler import report as preport, run as prun, table as ptable
from elastictrainer.profiler import table_format as pformat
from elastictrainer.errors import UserError

from helpers import tiny_attention, tiny_cnn  # noqa: E402


pytestmark = pytest.mark.tf_versions


@pytest.mark.parametrize("which", ["cnn_table", "attn_table"])
def test_every_tensor_timed_and_covered(which, request):
    model, table = request.getfixturevalue(which)
    assert [t["name"] for t in table["tensors"]] == [v.name for v in model.trainable_weights]
    assert table["unattributed"] == [] and table["coverage"] == 1.0
    for t in table["tensors"]:
        assert not t["estimated"], t
        # every tensor has at least its optimizer update in t_dw
        assert t["t_dw_ms"] > 0, t
    assert sorted(t["rank"] for t in table["tensors"]) == list(range(len(table["tensors"])))
    assert table["t_bp_ms"] == pytest.approx(table["t_full_ms"] - table["t_fp_ms"])


class _ScriptedClock:
    """Each reading 1 ms after the last; the steps wrapped by `timed` add their own time."""
    TICK = 1e-3

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += self.TICK
        return self.now

    def timed(self, make, seconds, first=0.0):
        """A make_*_step whose steps take `seconds` more on this clock, and its first call
        `first` more again (its compile; the step's own attributes, get_concrete_function say,
        pass through)."""
        clock = self

        class Timed:
            def __init__(self, fn):
                self.fn, self.calls = fn, 0

            def __call__(self, *args, **kwargs):
                clock.now += seconds + (first if self.calls == 0 else 0.0)
                self.calls += 1
                return self.fn(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.fn, name)

        return lambda *args, **kwargs: Timed(make(*args, **kwargs))


def test_step_times_are_what_the_clock_measured_on_each_step(monkeypatch):
    """t_fp is timed on the forward step, t_full on the training step and t_grads on the probe
    step (no update): with scripted step times the table holds exactly those, plus the clock's
    tick between the two readings around each step."""
    clock = _ScriptedClock()
    for name, seconds in (("make_forward_step", 0.030), ("make_train_step", 0.100),
                          ("make_probe_step", 0.080)):
        monkeypatch.setattr(train_steps, name, clock.timed(getattr(train_steps, name), seconds))
    table = prun.profile_model(tiny_cnn(), "tiny", 24, 4, 5, num_iterations=3, progress=False,
                               calibrate=False, clock=clock)
    assert table["t_fp_ms"] == pytest.approx(31.0)
    assert table["t_full_ms"] == pytest.approx(101.0)
    assert table["t_grads_ms"] == pytest.approx(81.0)
    assert table["t_bp_ms"] == pytest.approx(70.0) and table["timing_note"] is None


def test_a_runs_first_profiling_calibrates_only_when_its_steps_pay_for_it(monkeypatch):
    """With the run's steps given, the calibration is skipped when its reference compiles and
    rounds (each compile estimated as the probe step's, scripted here at 5 s) would take more
    than CALIBRATION_SHARE of those steps at the full step's pace: the table says why and keeps
    the probe step's compile as compile_ms.  A long enough run, or none given (profiler.py),
    calibrates."""
    clock = _ScriptedClock()
    for name, seconds, first in (("make_forward_step", 0.030, 0.0),
                                 ("make_train_step", 0.100, 0.0),
                                 ("make_probe_step", 0.080, 5.0)):
        monkeypatch.setattr(train_steps, name,
                            clock.timed(getattr(train_steps, name), seconds, first))

    def profile(run_steps):
        return prun.profile_model(tiny_cnn(), "tiny", 24, 4, 5, num_iterations=3,
                                  progress=False, clock=clock, run_steps=run_steps)

    refs = len(calibration.reference_selections(np.arange(len(tiny_cnn().trainable_weights))))
    estimate = calibration.calibration_estimate_s(5.0, 0.101, refs)
    short = int(estimate / (calibration.CALIBRATION_SHARE * 0.101))  # just too few steps
    table = profile(short)
    assert table["calibration"] is None
    assert f"the run's {short} steps" in table["calibration_skipped"]
    assert table["compile_ms"] == pytest.approx(5000.0, abs=2.0)
    assert "time model not calibrated: calibrating" in preport.summarize(table)
    for steps in (short + 2, None):
        table = profile(steps)
        assert table["calibration_skipped"] is None
        assert len(table["calibration"]["references"]) == refs


def test_forward_op_time_is_recorded_by_layer(cnn_table):
    """Every weighted layer of the traced forward pass gets its op time, and the layers hold
    most of the traced forward (the loss and the input's cast hold the rest)."""
    _, table = cnn_table
    layers = table["t_fp_layers_ms"]
    assert {"c1", "bn1", "dw", "c2", "fc"} <= set(layers)
    assert all(v > 0 for v in layers.values())
    assert 0.5 * table["t_fp_ops_ms"] <= sum(layers.values()) <= table["t_fp_ops_ms"] * (1 + 1e-9)


def test_rank_runs_from_output_back(cnn_table):
    model, table = cnn_table
    rank = {t["name"]: t["rank"] for t in table["tensors"]}
    assert rank["fc/bias:0"] == 0 and rank["fc/kernel:0"] == 1
    assert rank["c2/kernel:0"] < rank["dw/depthwise_kernel:0"] < rank["bn1/gamma:0"] < rank["c1/kernel:0"]


def test_heavy_ops_land_where_the_time_model_needs_them(cnn_table):
    _, table = cnn_table
    by = {t["name"]: t for t in table["tensors"]}
    # conv filter gradients are per-tensor work; the BN gradient op (one op for dx, dgamma, dbeta)
    # must be paid once anything at or below BN trains: it is t_dy of beta, the output-most of them.
    # Which op is whose is checked on the graph; on the few traced steps only the order of the
    # two times: on a busy 2-core machine the kernel's margin over the bias can be as low as 1.5x.
    info, variables = _analysed(tiny_cnn())
    k = {v.name: i for i, v in enumerate(variables)}
    filt = [n for n in info.kind if n.endswith("/c1/Conv2D/Conv2DBackpropFilter")]
    assert [info.lookup(n) for n in filt] == [("backward", 1 << k["c1/kernel:0"])]
    # the filter gradient's time is the kernel's own, none of it the bias' (scripted op times)
    times = {name: 0.0 for name in info.kind}
    times[filt[0]] = 3.0
    att = attribution.attribute(info, times, {}, num_steps=2)
    assert att["t_dw"][k["c1/kernel:0"]] == pytest.approx(1.5)
    assert att["t_dw"][k["c1/bias:0"]] == 0 and sum(att["t_dy"]) == 0
    assert by["bn1/beta:0"]["t_dy_ms"] > 0
    assert by["bn1/gamma:0"]["t_dy_ms"] == 0
    # the input-most tensor needs no error gradient below it
    assert by["c1/kernel:0"]["t_dy_ms"] == 0


def test_attention_tensors_all_attributed(attn_table):
    _, table = attn_table
    names = [t["name"] for t in table["tensors"]]
    assert any("mha" in n and "query" in n for n in names)
    dy_total = sum(t["t_dy_ms"] for t in table["tensors"])
    assert dy_total > 0


# ----------------------------------------------------------------- graph analysis, no trace
def _analysed(model, batch=2):
    variables = model.trainable_weights
    opt = keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3)
    opt.build(variables)
    cap = {}
    step = train_steps.make_train_step(model, opt, train_steps.make_loss(), variables, capture=cap)
    shape = (batch,) + tuple(model.input_shape[1:])
    x = tf.zeros(shape)
    y = tf.zeros((batch,), tf.int32)
    graph = step.get_concrete_function(x, y).graph
    return dataflow.GraphInfo(graph, cap["loss"], cap["grads"], variables, opt.variables), variables


def test_graph_classifies_weight_and_error_gradient_ops():
    model = tiny_cnn()
    info, variables = _analysed(model)
    k = {v.name: i for i, v in enumerate(variables)}
    kind, mask = info.lookup(f"gradient_tape/{model.name}/c2/Conv2D/Conv2DBackpropFilter")
    assert kind == "backward" and mask == 1 << k["c2/kernel:0"]
    kind, mask = info.lookup(f"gradient_tape/{model.name}/c2/Conv2D/Conv2DBackpropInput")
    # dx of c2 is needed by every tensor below c2
    below = [k[n] for n in ("c1/kernel:0", "c1/bias:0", "bn1/gamma:0", "bn1/beta:0",
                            "dw/depthwise_kernel:0", "dw/bias:0")]
    assert kind == "backward" and mask == sum(1 << b for b in below)
    kind, _ = info.lookup(f"{model.name}/c2/Conv2D")
    assert kind == "forward"
    # BatchNorm's moving-average updates are forward work of every step, not unattributed
    # backward time (counted as unattributed, a spike of it can take a tiny model's coverage
    # to 0.80)
    moving = [n for n in info.kind if n.startswith(f"{model.name}/bn1/AssignNewValue")]
    assert len(moving) == 2 and all(info.kind[n] == "forward" for n in moving)
    # a grappler-renamed op falls back to its name scope
    kind, mask = info.lookup(f"gradient_tape/{model.name}/c2/Conv2D/Conv2DBackpropFilter/some_rewrite_0")
    assert kind == "backward" and mask == 1 << k["c2/kernel:0"]
    # weight decay and momentum updates belong to the variable they update
    # (a factor several updates share would belong to all of them: it runs as soon as any trains)
    updates = [n for n, kd in info.kind.items() if kd == "update" and n.startswith("SGD/mul")]
    everything = (1 << len(variables)) - 1
    single = [n for n in updates if not info.mask[n] & (info.mask[n] - 1)]
    assert len(single) >= len(variables)
    assert all(info.mask[n] == everything for n in set(updates) - set(single))
    # ... and so do the constants that only feed its update
    lr_reads = [n for n in info.kind if n.startswith("SGD/Cast_") and n.endswith("/x")]
    assert lr_reads and all(info.kind[n] == "update" for n in lr_reads)
    # ... including the momentum slot's decay, which reads only the slot
    others = [n for n, kd in info.kind.items() if kd == "other" and n.startswith("SGD/")
              and info.ops[n].type == "Mul"]
    assert not others, others
    # the step count's increment reads no tensor's variable, but runs whenever anything trains
    count = [n for n, op in info.ops.items() if op.type == "AssignAddVariableOp"
             and op.inputs[1].dtype == tf.int64]
    assert len(count) == 1 and info.lookup(count[0]) == ("update", everything)


def test_fused_filter_with_bias_covers_the_bias():
    model = tiny_cnn()
    info, variables = _analysed(model)
    k = {v.name: i for i, v in enumerate(variables)}
    name = f"gradient_tape/{model.name}/c2/Conv2D/Conv2DBackpropFilter"
    cover = info.fused_cover(name,
                             "_MklNativeConv2DBackpropFilterWithBias")
    assert cover == 1 << k["c2/bias:0"]
    assert info.fused_cover(name, "Conv2DBackpropFilter") == 0


def test_missing_ops_are_estimated_from_flops():
    model = tiny_cnn()
    info, variables = _analysed(model)
    k = {v.name: i for i, v in enumerate(variables)}
    # a fake trace that lacks every op of c2's kernel gradient
    times = {}
    for name, kind in info.kind.items():
        if kind in ("backward", "update") and info.mask[name] != 1 << k["c2/kernel:0"]:
            times[name] = 1.0
    att = attribution.attribute(info, times, {}, num_steps=1)
    assert not att["covered"][k["c2/kernel:0"]]
    assert att["covered"][k["c1/kernel:0"]]
    flops = info.dw_flops(variables, 2)
    assert flops[k["c2/kernel:0"]] > flops[k["c2/bias:0"]] > 0


def test_attribution_time_model_is_additive():
    """Sum of every tensor's t_dw and t_dy equals the attributed non-forward op time."""
    model = tiny_cnn()
    info, _ = _analysed(model)
    times = {name: 0.5 for name, kind in info.kind.items() if kind != "other"}
    att = attribution.attribute(info, times, {}, num_steps=2)
    attributed = sum(0.25 for n, kd in info.kind.items() if kd in ("backward", "update") and info.mask[n])
    assert sum(att["t_dw"]) + sum(att["t_dy"]) == pytest.approx(attributed)
    assert att["coverage"] == pytest.approx(1.0)


# ----------------------------------------------------------------- table files
def test_table_roundtrip_and_validation(tmp_path, cnn_table):
    model, table = cnn_table
    path = str(tmp_path / "t.json")
    ptable.save_table(table, path)
    assert ptable.load_table(path, model=model, input_size=24, batch_size=4)["model"] == "tiny_cnn"
    with pytest.raises(UserError, match="input size"):
        ptable.load_table(path, input_size=32)
    with pytest.raises(UserError, match="batch size"):
        ptable.load_table(path, batch_size=8)
    with pytest.raises(UserError, match="tensors"):
        ptable.load_table(path, model=tiny_attention())
    other = tiny_cnn()  # same structure, other variable names
    if [v.name for v in other.trainable_weights] != [v.name for v in model.trainable_weights]:
        with pytest.raises(UserError, match="does not match"):
            ptable.load_table(path, model=other)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt"):
        ptable.load_table(str(tmp_path / "bad.json"))
    (tmp_path / "partial.json").write_text(json.dumps({"model": "x"}))
    with pytest.raises(UserError, match="missing"):
        ptable.load_table(str(tmp_path / "partial.json"))
    with pytest.raises(UserError, match="profiler.py"):
        ptable.load_table(str(tmp_path / "absent.json"))


def _all_extras(table):
    """Every key a TimingTable read from `table` keeps undeclared, by record."""
    found = {"table": table.extra}
    found.update((f"tensor {k}", t.extra) for k, t in enumerate(table.tensors))
    found.update((f"unattributed {k}", u.extra) for k, u in enumerate(table.unattributed))
    if table.calibration:
        found["calibration"] = table.calibration.extra
        found.update((f"reference {k}", r.extra)
                     for k, r in enumerate(table.calibration.references))
    return {k: v for k, v in found.items() if v}


def test_a_profiled_table_round_trips_through_its_declared_format(tmp_path, cnn_table):
    model, table = cnn_table
    path = str(tmp_path / "t.json")
    ptable.save_table(table, path)
    text = open(path).read()
    typed = pformat.TimingTable.from_dict(json.loads(text), path)
    assert _all_extras(typed) == {}  # the profiler writes no key the format does not declare
    assert typed.version == pformat.TABLE_VERSION and typed.calibration is not None
    assert isinstance(typed.tensors[0], pformat.TensorTiming)
    assert typed.tensors[0].name == model.trainable_weights[0].name
    # the same file again, byte for byte, and load_table's dict is the profiler's
    assert json.dumps(typed.to_dict(), indent=1) == text
    assert ptable.load_table(path, model=model) == table
    uncalibrated = dict(table, calibration=None, trace="x.xplane.pb", timing_note="busy")
    assert pformat.TimingTable.from_dict(uncalibrated).to_dict() == uncalibrated


def test_a_table_of_a_newer_format_is_refused_in_one_line(tmp_path, cnn_table):
    _, table = cnn_table
    newer = pformat.TABLE_VERSION + 1
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(dict(table, version=newer, tensors="renamed")))
    with pytest.raises(UserError) as e:
        ptable.load_table(str(path))
    assert str(e.value) == (f"timing table {path} has format version {newer}, newer than this "
                            f"ElasticTrainer reads ({pformat.TABLE_VERSION}); upgrade "
                            f"elastictrainer or re-run profiler.py")
    for bad in ("2", 0, None, True, 1.5):
        path.write_text(json.dumps(dict(table, version=bad)))
        with pytest.raises(UserError, match=r"corrupt timing table .*: version .* is not a "
                                            r"positive integer"):
            ptable.load_table(str(path))


def test_an_older_table_is_migrated_with_the_defaults_it_lacked(tmp_path, cnn_table):
    _, table = cnn_table
    old = json.loads(json.dumps(table))
    # a table of an older format: written by hand, or by a profiler that did not record these
    for key in ("version", "optimizer", "t_grads_ms", "timing_note", "peak_rss_mb",
                "profiled_pid", "host", "created"):
        del old[key]
    del old["calibration"]["fixed_ms"]
    del old["tensors"][0]["estimated"], old["tensors"][0]["shape"]
    old["note"] = "kept"  # a key the format does not declare survives
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    untouched = json.loads(json.dumps(old))
    assert pformat.migrate_table(old) is not old and old == untouched
    loaded = ptable.load_table(str(path), optimizer="sgd")
    assert loaded["version"] == pformat.TABLE_VERSION
    assert loaded["optimizer"] == "sgd" and loaded["t_grads_ms"] is None
    assert loaded["calibration"]["fixed_ms"] == 0.0
    assert loaded["tensors"][0]["estimated"] is False and loaded["tensors"][0]["shape"] is None
    assert loaded["timing_note"] is None and loaded["host"] is None and loaded["note"] == "kept"
    assert pformat.TimingTable.from_dict(old).extra == {"note": "kept"}
    for key in ("model", "t_fp_ms", "t_full_ms", "coverage", "unattributed"):
        assert loaded[key] == table[key]
    assert [t["t_dw_ms"] for t in loaded["tensors"]] == [t["t_dw_ms"] for t in table["tensors"]]
    tm = time_model.TimeModel(loaded)
    assert tm.calibrated and tm.fixed_ms == 0.0
    assert "calibrated on" in preport.summarize(loaded)


def test_a_table_of_an_older_version_is_raised_to_the_current_one(tmp_path, cnn_table,
                                                                   monkeypatch):
    _, table = cnn_table
    path = str(tmp_path / "t.json")
    ptable.save_table(table, path)
    monkeypatch.setattr(pformat, "TABLE_VERSION", table["version"] + 1)
    loaded = ptable.load_table(path)
    assert loaded["version"] == table["version"] + 1
    assert dict(loaded, version=table["version"]) == table


def test_plot_writes_png_and_pdf(tmp_path, cnn_table):
    _, table = cnn_table
    png = plotting.draw_profile(table, str(tmp_path / "p.png"))
    assert os.path.getsize(png) > 1000 and os.path.getsize(str(tmp_path / "p.pdf")) > 1000


# ----------------------------------------------------------------- the CLI's configuration
def test_default_table_path_of_a_user_model_uses_its_own_sizes(tmp_path, monkeypatch):
    """profiler.py writes where main.py looks: sizes come from the file, not the flag defaults."""
    path = str(tmp_path / "mine.keras")
    tiny_cnn(num_classes=3).save(path)
    monkeypatch.chdir(tmp_path)
    table, out = prun.profile_configuration(path, batch_size=2, num_iterations=1, warmup=1,
                                          progress=False)
    assert out == ptable.default_table_path(path, 24, 2, 3)
    assert os.path.exists(out)


def test_t_grads_is_timed_on_the_runs_probe_function(monkeypatch):
    """A run scales its timed full steps (the probe function, no update) by t_full / t_grads:
    the profiler times t_grads on that same function, untrained, so the scale is exact."""
    made, calls = [], []
    real = train_steps.make_probe_step

    def spy(*args, **kwargs):
        fn = real(*args, **kwargs)
        made.append(fn)

        def wrapped(x, y, want_terms=False):
            calls.append(bool(want_terms))
            return fn(x, y, want_terms)
        return wrapped

    monkeypatch.setattr(train_steps, "make_probe_step", spy)
    model = tiny_cnn()
    before = [w.copy() for w in model.get_weights()]
    table = prun.profile_model(model, "tiny_cnn", 24, 4, 5, num_iterations=2, warmup=1,
                               progress=False, calibrate=False)
    assert len(made) == 1 and len(calls) == 1 + 2  # warm-up, then each timed iteration
    assert set(calls) == {False}
    assert table["t_grads_ms"] > 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_profiled_table_is_calibrated_and_time_model_uses_it(cnn_table):
    from elastictrainer.method import time_model

    model, table = cnn_table
    cal = table["calibration"]
    assert {r["name"] for r in cal["references"]} == {"output_only", "dy_to_input", "dy_to_half",
                                                      "all_to_half"}
    # the scales are the fit of the references' own measured ratios, on their selections
    masks = calibration.reference_selections([t["rank"] for t in table["tensors"]])
    measured = {r["name"]: (masks[r["name"]], r["measured_ratio"]) for r in cal["references"]}
    raw_dy = np.array([t["t_dy_ms"] for t in table["tensors"]])
    assert (cal["dw_scale"], cal["dy_scale"], cal["fixed_ms"]) == pytest.approx(
        calibration.fit_fixed_cost(
            [t["t_dw_ms"] for t in table["tensors"]], raw_dy,
            [t["rank"] for t in table["tensors"]], table["t_fp_ms"], table["t_full_ms"],
            measured))
    tm = time_model.TimeModel(table)
    assert tm.calibrated
    raw_dw = np.array([t["t_dw_ms"] for t in table["tensors"]])
    assert tm.t_dw == pytest.approx(raw_dw * cal["dw_scale"])
    assert tm.t_fp == pytest.approx(table["t_fp_ms"] + cal["fixed_ms"])
    # the step without its update, timed with the others (what the update adds to a step)
    assert 0 < table["t_grads_ms"]
    # compiling the references' steps was timed: a selection's compile, known before a run
    assert table["compile_ms"] > 0
    assert tm.predicted_ratio(np.ones(len(raw_dw), bool)) == pytest.approx(1.0)
    for r in cal["references"]:  # the stored prediction is the time model's
        mask = calibration.reference_selections([t["rank"] for t in table["tensors"]])[r["name"]]
        assert tm.predicted_ratio(mask) == pytest.approx(r["calibrated_ratio"])
    assert "calibrated on 4 timed selections" in preport.summarize(table)
    noisy = json.loads(json.dumps(table))
    noisy["calibration"]["references"][0]["measured_ratio"] *= 1.5
    assert "profile again" in preport.summarize(noisy)


def test_uncalibrated_profile_and_corrupt_calibration(tmp_path):
    from elastictrainer.method import time_model

    model = tiny_cnn()
    table = prun.profile_model(model, "tiny_cnn", 24, 2, 5, num_iterations=1, warmup=1,
                             progress=False, calibrate=False)
    assert table["calibration"] is None and not time_model.TimeModel(table).calibrated
    assert table["compile_ms"] is None  # no reference selection compiled
    assert pformat.TimingTable.from_dict(table).to_dict() == table
    assert "not calibrated" in preport.summarize(table)
    table["calibration"] = {"dw_scale": float("nan"), "dy_scale": 1.0, "references": []}
    path = str(tmp_path / "t.json")
    with open(path, "w") as f:
        json.dump(table, f)
    with pytest.raises(UserError, match="bad calibration"):
        ptable.load_table(path)
    table["calibration"] = None
    for bad in ("fast", -1.0, 0):
        table["t_grads_ms"] = bad
        with open(path, "w") as f:
            json.dump(table, f)
        with pytest.raises(UserError, match="t_grads_ms"):
            ptable.load_table(path)
    table["t_grads_ms"] = 5.0
    table["compile_ms"] = -1.0
    with open(path, "w") as f:
        json.dump(table, f)
    with pytest.raises(UserError, match="compile_ms"):
        ptable.load_table(path)
    del table["t_grads_ms"], table["compile_ms"]  # a table without them: not timed
    with open(path, "w") as f:
        json.dump(table, f)
    loaded = ptable.load_table(path)
    assert loaded["t_grads_ms"] is None and loaded["compile_ms"] is None


def test_a_tensor_estimated_from_flops_does_not_break_the_calibration(monkeypatch):
    """The FLOPs fallback for a tensor the trace misses leaves the calibration's timed
    selections (a dict) as they are, and fit_calibration fits them."""
    real = attribution.attribute

    def trace_misses_tensor_0(*args, **kwargs):
        att = real(*args, **kwargs)
        att["covered"][0] = False
        return att

    monkeypatch.setattr(attribution, "attribute", trace_misses_tensor_0)
    table = prun.profile_model(tiny_cnn(), "tiny", 24, 4, 5, num_iterations=2, progress=False,
                               calibrate=True)
    assert table["tensors"][0]["estimated"] and not table["tensors"][1]["estimated"]
    assert table["tensors"][0]["t_dw_ms"] > 0
    cal = table["calibration"]
    assert cal is not None and len(cal["references"]) == 4


def test_profiles_with_the_runs_optimizer_and_refuses_a_table_of_another(tmp_path, monkeypatch):
    from elastictrainer.train import steps as train_steps

    built = []
    real = train_steps.make_train_step
    monkeypatch.setattr(train_steps, "make_train_step",
                        lambda model, opt, *a, **kw: built.append(type(opt).__name__)
                        or real(model, opt, *a, **kw))
    model = tiny_cnn()
    table = prun.profile_model(model, "tiny", 24, 4, 5, num_iterations=2, progress=False,
                               calibrate=False, optimizer="adam")
    assert built == ["Adam"] and table["optimizer"] == "adam"
    # Adam's moment updates are attributed to their tensors, its step count to all of them
    assert table["unattributed"] == []
    path = str(tmp_path / "t.json")
    ptable.save_table(table, path)
    assert ptable.load_table(path, model=model, optimizer="adam")["optimizer"] == "adam"
    with pytest.raises(UserError, match="profiled with --optimizer adam, not sgd"):
        ptable.load_table(path, optimizer="sgd")
    old = dict(table)
    del old["optimizer"]  # a table that does not name its optimizer is SGD's
    ptable.save_table(old, path)
    assert ptable.load_table(path, optimizer="sgd")
    with pytest.raises(UserError, match="--optimizer"):
        ptable.load_table(path, optimizer="adam")
    assert ptable.default_table_path("m", 24, 4, 5).endswith("m_i24_b4_c5.json")
    assert ptable.default_table_path("m", 24, 4, 5, "adam").endswith("m_i24_b4_c5_adam.json")


@pytest.mark.parametrize("edit,needle", [
    ({"t_full_ms": 0.0}, "t_full_ms 0.0"),
    ({"t_fp_ms": float("nan")}, "t_fp_ms nan"),
    ({"t_fp_ms": 30.0, "t_full_ms": 20.0}, "t_fp_ms < t_full_ms"),
    ({"tensor_0": {"t_dw_ms": -1.0}}, "t_dw_ms -1.0"),
    ({"tensor_0": {"t_dy_ms": float("nan")}}, "t_dy_ms nan"),
])
def test_table_values_out_of_range_are_one_line_errors(tmp_path, cnn_table, edit, needle):
    _, table = cnn_table
    bad = json.loads(json.dumps(table))
    for key, value in edit.items():
        if key == "tensor_0":
            bad["tensors"][0].update(value)
        else:
            bad[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))  # json writes NaN, as Python's json reads it
    with pytest.raises(UserError, match=needle) as e:
        ptable.load_table(str(path))
    assert "\n" not in str(e.value)


def test_a_forward_pass_timed_slower_than_the_step_falls_back_to_the_traced_share(
        tmp_path, monkeypatch):
    """On a busy machine a tiny model's forward steps can time slower than its full steps (3.9
    ms against 3.4 ms, say); the table then takes the forward share from the trace, and loads."""
    from elastictrainer.train import steps as train_steps

    class Clock:
        """Each reading 1 ms after the last; a forward step takes 200 ms more."""
        now = 0.0

        def __call__(self):
            self.now += 1e-3
            return self.now

    clock = Clock()
    real = train_steps.make_forward_step

    def slow_forward(model, loss_fn):
        forward = real(model, loss_fn)

        def call(x, y):
            clock.now += 0.2
            return forward(x, y)
        return call

    monkeypatch.setattr(train_steps, "make_forward_step", slow_forward)
    from elastictrainer.machine import peak_rss_mb

    rss_before = peak_rss_mb()
    table = prun.profile_model(tiny_cnn(), "tiny", 24, 4, 5, num_iterations=2, progress=False,
                               calibrate=False, clock=clock)
    assert "traced forward share" in table["timing_note"]
    # this process's peak memory (a peak only grows), in MB as read during the profile
    assert rss_before <= table["peak_rss_mb"] <= peak_rss_mb()
    share = table["t_fp_ops_ms"] / (table["t_fp_ops_ms"] + table["t_bp_ops_ms"])
    assert table["t_fp_ms"] == pytest.approx(share * table["t_full_ms"])
    path = str(tmp_path / "t.json")
    ptable.save_table(table, path)
    assert ptable.load_table(path)
    assert "profile again on a quiet machine" in preport.summarize(table)


def test_profiling_first_keeps_its_trace_where_tensorboards_profile_tab_finds_it(tmp_path):
    """A run that profiles first passes its directory: the trace stays there, in the layout
    TensorBoard's Profile tab reads (<dir>/plugins/profile/<time>/<host>.xplane.pb)."""
    table = prun.load_or_profile(str(tmp_path / "t.json"), tiny_cnn(), "tiny_cnn", 24, 4, 5,
                                 progress=False, log=lambda m: None, in_child=False,
                                 trace_dir=str(tmp_path / "run"))
    kept = list((tmp_path / "run" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(kept) == 1 and table["trace"] == str(kept[0])
