"""A Keras 3 model file through the paper's command lines, in this process: profiler.py
profiles it, main.py's flags train it, a run stopped by Ctrl-C and started again ends exactly
as the uninterrupted one (the random flip and the dropout draw from Keras 3 seed generators,
which the checkpoint carries on), and plot.py draws it.  The command lines as subprocesses, and
a run killed with SIGKILL, are e2e/test_profiler.py's and e2e/test_resume.py's."""
import json
import os
import signal

import pytest

from elastictrainer import cli, runlog
from elastictrainer.runs import loop
from helpers import assert_figures, keras3_cnn, plot_cli, script_cli, scripted_table

KEYS = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import keras
    tmp = tmp_path_factory.mktemp("k3cli")
    keras.utils.set_random_seed(0)
    keras3_cnn(num_classes=10, augment=True).save(str(tmp / "k3aug.keras"))
    return tmp


def test_profiler_py_profiles_a_keras3_file(saved, capsys, monkeypatch):
    monkeypatch.chdir(saved)  # the trace's default folder is relative, as for a user
    out = str(saved / "table.json")
    code, _, err = script_cli("profiler", [
        "--model_name", str(saved / "k3aug.keras"), "--batch_size", "8", "--num_iterations",
        "2", "--output", out, "--figure", "", "--optimizer", "adam", "--quiet"], capsys)
    assert code == 0, err
    with open(out) as f:
        table = json.load(f)
    assert table["input_size"] == 16 and table["num_classes"] == 10
    # every traced backward and update op is some tensor's (a share of timed ops would be a
    # wall-clock bound)
    assert table["unattributed"] == [] and table["coverage"] == 1.0
    assert table["tensors"][0]["name"].endswith("/kernel")


def _run(saved, name, log=lambda m: None):
    argv = ["--model_name", str(saved / "k3aug.keras"), "--input_size", "16", "--dataset_name",
            "synthetic", "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", "3", "--steps_per_epoch", "5", "--interval", "1", "--rho", "0.9",
            "--rho_feedback", "false", "--economy", "false", "--seed", "3",
            "--timing_table", str(saved / "scripted.json"), "--logdir", str(saved / "logs"),
            "--run_name", name, "--quiet"]
    return loop.run(cli.config_from_args(cli.train_parser().parse_args(argv)), log=log)


def test_a_keras3_run_stopped_by_ctrl_c_resumes_bit_for_bit_and_plots(saved, capsys):
    import keras

    # scripted times: under rho 0.9 a selection trains some of the 8 tensors, on any machine
    scripted_table(keras.saving.load_model(str(saved / "k3aug.keras")),
                   saved / "scripted.json", 16, 8, "adam")
    whole = _run(saved, "whole")

    def ctrl_c_after_epoch_2(message):
        if message.startswith("epoch 2:"):
            os.kill(os.getpid(), signal.SIGINT)

    stopped = _run(saved, "stopped", ctrl_c_after_epoch_2)
    assert stopped["status"] == "interrupted" and len(stopped["epochs"]) == 2
    said = []
    again = _run(saved, "stopped", said.append)
    assert any(line.startswith("resuming") for line in said)
    assert [[e[k] for k in KEYS] for e in whole["epochs"]] == \
        [[e[k] for k in KEYS] for e in again["epochs"]]
    assert [s["mask"] for s in whole["selections"]] == [s["mask"] for s in again["selections"]]
    assert 1 <= whole["epochs"][-1]["selected"] < 8
    run = str(saved / "logs" / "whole")
    for kind in ("curves", "selection"):
        code, _, err = plot_cli([kind, run, "--out", str(saved / "figs" / kind)], capsys)
        assert code == 0, err
        assert_figures(str(saved / "figs" / kind))
