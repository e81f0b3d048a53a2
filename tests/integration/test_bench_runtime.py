"""scripts/bench_runtime.py: one quick cell runs full and elastic training, and its JSON and
Markdown hold the two summaries' numbers, merged with the cells the file already had."""
import json

import pytest

from helpers import bench_runtime_summary as _summary, load_script

from elastictrainer import runlog


def test_quick_cell_writes_consistent_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    script = load_script("bench_runtime")
    out, logdir = tmp_path / "figs" / "bench_runtime", tmp_path / "logs"
    # a cell run before (another machine, another day): kept, and in the table
    earlier = {"date": "2020-01-02T03:04:05",
               "machine": {"platform": "Linux-x", "cpu": "Old CPU", "cores": 4,
                           "tensorflow": "2.0"},
               "results": script.derive(_summary(10.0, 80.0), _summary(
                   6.0, 79.0, wall_ratio=0.58, measured_ratio=0.51, reselection_overhead_s=0.6,
                   reselection_overhead_parts_s={"compiling": 0.6}, selections=[]), 0.5)}
    out.parent.mkdir()
    (tmp_path / "figs" / "bench_runtime.json").write_text(
        json.dumps({"cells": {"smallcnn32_b8_2000": earlier}}))

    # economy off: the quick run is too short to pay for a selection's compile otherwise.
    # rho 0.8: this 16 px model's forward pass is about half of its step, and on a loaded
    # machine more (0.518 was measured), which the default 0.5 would refuse
    assert script.main(["--quick", "--cells", "smallcnn32_b8_500", "--no_economy", "--quiet",
                        "--rho", "0.8",
                        "--logdir", str(logdir), "--out", str(out),
                        "--profiles", str(tmp_path / "profiles")]) == 0

    cells = json.loads((tmp_path / "figs" / "bench_runtime.json").read_text())["cells"]
    assert set(cells) == {"smallcnn32_b8_2000", "smallcnn32_b8_500_quick"}
    cell = cells["smallcnn32_b8_500_quick"]
    assert set(cell["machine"]) >= {"platform", "cpu", "cores", "tensorflow"} and cell["date"]
    assert cell["settings"]["model_name"] == "smallcnn" and cell["settings"]["weights"] == "none"
    full = runlog.read_summary(str(logdir / "smallcnn32_b8_500_quick_full"))
    elastic = runlog.read_summary(str(logdir / "smallcnn32_b8_500_quick_elastic"))
    assert full["train_type"] == "full_training" and elastic["train_type"] == "elastic_training"
    assert full["status"] == elastic["status"] == "finished"
    assert cell["summaries"]["full"]["train_time_s"] == full["train_time_s"]

    r = cell["results"]
    steps = script.QUICK_STEPS * 2
    assert r["steps"] == steps == full["steps_per_epoch"] * len(full["epochs"])
    assert r["wall_ratio_measured"] == pytest.approx(
        elastic["train_time_s"] / full["train_time_s"])
    assert r["wall_ratio_estimated"] == elastic["wall_ratio"] is not None
    assert r["measured_step_ratio"] == elastic["measured_ratio"] is not None
    assert r["overhead_share"] == pytest.approx(
        elastic["reselection_overhead_s"] / elastic["train_time_s"])
    assert r["overhead_parts_s"] == elastic["reselection_overhead_parts_s"]
    assert set(r["overhead_parts_s"]) == {"importance", "timing full steps", "compiling",
                                          "solving"}
    assert r["overhead_parts_s"]["compiling"] > 0  # a selection's step was compiled
    assert r["full_step_ms"] == pytest.approx(1e3 * full["train_time_s"] / steps)
    assert (r["best_accuracy_full"], r["best_accuracy_elastic"]) == (
        full["best_test_accuracy"], elastic["best_test_accuracy"])
    assert r["selections"] == len(elastic["selections"]) >= 1
    assert r["corrections"] == len(elastic["corrections"])

    md = (tmp_path / "figs" / "bench_runtime.md").read_text()
    assert md.startswith("Run 2020-01-02 to ")  # two machines and dates: both named
    assert "Old CPU, 4 cores" in md and cell["machine"]["cpu"] in md
    runs_part, _, profiles_part = md.partition("The timing tables the cells used")
    rows = [line for line in runs_part.splitlines() if line.startswith("| smallcnn")]
    # the grid's order, whatever order the cells ran in
    assert [row.split(" | ")[0] for row in rows] == ["| smallcnn32_b8_500_quick",
                                                     "| smallcnn32_b8_2000"]
    assert rows[0] == script.row("smallcnn32_b8_500_quick", r)
    # the profiler's side of the cell: its timing table's numbers, one row per profiled cell
    p = cell["profile"]
    assert p["tensors"] == full["num_tensors"] == 20 and 0 < p["t_fp_ms"] < p["t_full_ms"]
    assert p["compile_ms"] > 0 and p["t_grads_ms"] > 0
    assert script.profile_row("smallcnn32_b8_500_quick", p) in profiles_part.splitlines()
    assert f"| {r['wall_ratio_measured']:.3f} |" in rows[0]
