import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tf_keras as keras

from helpers import ROOT


def test_bench_speedup_smoke(tmp_path):
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, name="c1")(inp)
    x = keras.layers.Conv2D(8, 3, name="c2", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(4, name="head")(x)
    keras.Model(inp, x).save(str(tmp_path / "m.keras"))
    out = tmp_path / "b.json"
    # rhos above the tiny model's forward floor on an idle machine (0.86 on a busy one)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_speedup.py"),
                        "--model_name", str(tmp_path / "m.keras"), "--rhos", "0.85,0.95",
                        "--repeats", "2", "--steps", "2", "--random_selections", "3",
                        "--reselections", "12", "--importance", "uniform", "--out", str(out),
                        "--quiet"], cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.load(open(out))
    for key in ("model", "input_size", "batch_size", "results", "time_model_mape",
                "time_model_mape_corrected", "correction", "dp_ms",
                "rss_growth_mb_per_reselection"):
        assert key in res
    assert [x["rho"] for x in res["results"]] == [0.85, 0.95]
    for x in res["results"]:
        assert set(x) >= {"rho", "measured_ratio", "predicted_ratio", "selected"}
        assert x["measured_ratio"] > 0
        history = x["closed_loop_history"]
        assert len(history) == x["corrections"] + 1 and 0 <= x["corrections"] <= 3
        if x["limited_by"] == "forward floor":  # a busy machine: the forward pass alone is over rho
            assert x["predicted_ratio"] >= x["rho"] and x["selected"] == 1
        else:
            assert x["predicted_ratio"] <= x["rho"] + 1e-9
            # uniform importance: every tensor is worth its cost, so the budget binds, or what is
            # left out costs more than the budget left even with 5% more (6 coarse tensors)
            assert x["limited_by"] in ("budget", "depth")
            # the closed loop is the runtime's: it starts from the selection the open loop
            # timed and keeps one record per selection it tried, each measured; when no tensor
            # fits over the forward floor (rho just above it on a busy machine), the open loop
            # times the empty step and the runtime trains the cheapest tensor instead
            if x["selected"]:
                assert history[0][:2] == [x["selected"], x["predicted_ratio"]]
            else:
                assert history[0][0] == 1
        assert history[-1][2] == x["closed_loop_ratio"] > 0
    assert res["time_model_mape_corrected"] is not None
    # the same random selections judged by the table's model, without its fixed cost, and
    # without calibration
    by = res["time_model_mape_by_model"]
    assert set(by) == {"table", "two_scales", "uniform"}
    assert abs(by["table"] - res["time_model_mape"]) < 1e-12
    # the noise readout is the spread of its own repeated ratios
    ratios = np.asarray(res["noise"]["ratios"], float)
    assert len(ratios) == 8 and res["noise"]["cv"] == pytest.approx(ratios.std() / ratios.mean())
    assert len(res["rss_mb"]) == 12
    assert os.path.getsize(tmp_path / "b.png") > 1000
