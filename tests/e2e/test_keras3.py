"""A Keras 3 model file through the paper's command lines: profiler.py profiles it, main.py
trains it, a run killed and started again ends bit for bit as the uninterrupted one, and
plot.py draws it."""
import json
import os
import signal
import subprocess
import sys

import pytest

from elastictrainer import runlog
from elastictrainer.runs.interrupt import FAULT_AT_STEP_ENV
from helpers import ROOT, assert_figures, keras3_cnn, plot_cli, run_profiler_cli


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import keras
    tmp = tmp_path_factory.mktemp("k3cli")
    keras.utils.set_random_seed(0)
    keras3_cnn(num_classes=10, augment=True).save(str(tmp / "k3aug.keras"))
    return tmp


def test_profiler_cli_profiles_a_keras3_file(saved):
    out = str(saved / "table.json")
    r = run_profiler_cli(["--model_name", str(saved / "k3aug.keras"), "--batch_size", "8",
                          "--num_iterations", "2", "--output", out, "--figure", "",
                          "--optimizer", "adam", "--quiet"], cwd=str(saved))
    assert r.returncode == 0, r.stderr[-2000:]
    table = json.load(open(out))
    assert table["input_size"] == 16 and table["num_classes"] == 10
    # every traced backward and update op is some tensor's (a share of timed ops would be a
    # wall-clock bound)
    assert table["unattributed"] == [] and table["coverage"] == 1.0
    assert table["tensors"][0]["name"].endswith("/kernel")


def _cmd(tmp, name):
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name",
            str(tmp / "k3aug.keras"), "--input_size", "16", "--dataset_name", "synthetic",
            "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", "3", "--steps_per_epoch", "5", "--interval", "1", "--rho", "0.9",
            "--rho_feedback", "false", "--economy", "false", "--seed", "3",
            "--timing_table", str(tmp / "table.json"), "--logdir", str(tmp / "logs"),
            "--run_name", name, "--quiet"]


def test_a_killed_keras3_run_resumes_bit_for_bit_and_plots(saved, capsys):
    """The random flip and the dropout draw from Keras 3 seed generators, which the
    checkpoint carries on as well."""
    whole = subprocess.run(_cmd(saved, "whole"), capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-2000:]
    # killed as it is about to run step 12: epochs 1 and 2 checkpointed, epoch 3 under way
    killed = subprocess.run(_cmd(saved, "killed"), capture_output=True, timeout=900,
                            env=dict(os.environ, **{FAULT_AT_STEP_ENV: "12"}))
    assert killed.returncode == -signal.SIGKILL
    again = subprocess.run(_cmd(saved, "killed"), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "resuming" in again.stdout, again.stderr[-2000:]
    a = runlog.read_summary(str(saved / "logs" / "whole"))
    b = runlog.read_summary(str(saved / "logs" / "killed"))
    keys = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")
    assert [[e[k] for k in keys] for e in a["epochs"]] == [[e[k] for k in keys]
                                                           for e in b["epochs"]]
    assert [s["mask"] for s in a["selections"]] == [s["mask"] for s in b["selections"]]
    assert 1 <= a["epochs"][-1]["selected"] < 8
    run = str(saved / "logs" / "whole")
    for kind in ("curves", "selection"):
        code, _, err = plot_cli([kind, run, "--out", str(saved / "figs" / kind)], capsys)
        assert code == 0, err
        assert_figures(str(saved / "figs" / kind))
