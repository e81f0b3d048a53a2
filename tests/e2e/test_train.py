"""main.py run twice as a subprocess: profiling first does not change what the run draws."""
import json
import os
import subprocess
import sys

import pytest

from elastictrainer import runlog
from helpers import ROOT

pytestmark = pytest.mark.tf_versions


def test_profiling_first_does_not_change_the_run(tmp_path):
    """Same seed, same run: a run that profiles first draws the same random stream (augmentation
    generators, op-seed counter) as one that loads the table it wrote."""
    def run(name):
        r = subprocess.run(
            [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", "smallcnn",
             "--weights", "none", "--dataset_name", "synthetic", "--input_size", "16",
             "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
             "--num_epochs", "2", "--steps_per_epoch", "6", "--interval", "1", "--rho", "0.7",
             "--seed", "1", "--rho_feedback", "false", "--timing_table", str(tmp_path / "t.json"), "--logdir",
             str(tmp_path / "logs"), "--run_name", name, "--quiet"],
            capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.load(open(tmp_path / "logs" / name / runlog.SUMMARY_FILE))

    first = run("profiled_first")  # no table yet: this run profiles, then trains
    assert (tmp_path / "t.json").exists()
    again = run("table_loaded")
    keys = ("test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")
    assert [[e[k] for k in keys] for e in first["epochs"]] == \
        [[e[k] for k in keys] for e in again["epochs"]]
    assert [s["mask"] for s in first["selections"]] == [s["mask"] for s in again["selections"]]
    # the first run waited for its profiling: it says so, and counts it against itself
    assert first["profiling_s"] > 0 and again["profiling_s"] == 0.0
