"""scripts/bench_runtime.py: a cell's numbers derived from two summaries, and its table row."""
import pytest

from helpers import bench_runtime_summary as _summary, load_script


def test_derive_and_row_from_two_summaries():
    script = load_script("bench_runtime")
    full = _summary(10.0, 80.0)
    elastic = _summary(6.0, 79.0, wall_ratio=0.58, measured_ratio=0.51,
                       reselection_overhead_s=0.6,
                       reselection_overhead_parts_s={"importance": 0.1, "compiling": 0.5},
                       selections=[{"mask": [0, 1, 1], "reason": "interval"}],
                       corrections=[{"step": 3}])
    r = script.derive(full, elastic, 0.5)
    assert r["steps"] == 20 and r["full_step_ms"] == 500.0
    assert r["wall_ratio_measured"] == 0.6 and r["overhead_share"] == pytest.approx(0.1)
    assert (r["selections"], r["corrections"], r["selected_tensors"]) == (1, 1, [2])
    assert script.row("c", r) == ("| c | 20 | 500.0 | 0.600 | 0.580 | 0.510 (0.5) | 10.0% | "
                                  "importance 0.10 s, compiling 0.50 s | 80.0% / 79.0% | 1 / 1 |")
    with pytest.raises(RuntimeError, match="different steps"):
        script.derive(full, dict(elastic, epochs=[{}]), 0.5)
