"""Resuming a run (checkpoint.py): a run killed with SIGKILL and started again ends exactly as
the same run never interrupted, and from the checkpoint before when its newest is damaged.
The uninterrupted run profiles first and the killed one loads the table it wrote, so the same
comparison shows that profiling first does not change what a run draws (augmentation
generators, dropout, the op-seed counter).
Checked in this process instead: a resume with the prefix cache serving
(tests/integration/test_prefix_cache.py), what a resume refuses (other settings, a finished
run: tests/unit/test_resume.py; every checkpoint damaged: tests/integration/test_resume.py) and
--resume false (tests/unit/test_resume.py)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from elastictrainer import runlog
from elastictrainer.runs.interrupt import FAULT_AT_STEP_ENV

from helpers import ROOT

EPOCHS = 3
# The kill comes as the killed run is about to run this global step (counted from 0): two epochs
# of 5 steps are checkpointed, and epoch 3's selection and first two steps are done, then lost.
KILL_AT_STEP = 12
KEYS = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")


def _cmd(tmp, name, *extra):
    # smallcnn: augmentation and dropout draw random numbers, which must continue as well;
    # economy off: 15 steps would pay for no selection's compile, and the run would train every
    # tensor without re-selecting; uncached, the paper's protocol (a resume with the cache
    # serving is test_prefix_cache.py's); rho 0.9, since the forward pass of a 16 px smallcnn,
    # profiled on a loaded 2-core machine, measured up to 0.727 of a full step, and a rho under
    # that floor is refused
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", "smallcnn",
            "--weights", "none", "--dataset_name", "synthetic", "--input_size", "16",
            "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", str(EPOCHS), "--steps_per_epoch", "5", "--interval", "1",
            "--rho", "0.9", "--rho_feedback", "false", "--economy", "false",
            "--cache_frozen_prefix", "false", "--seed", "3",
            "--timing_table", str(tmp / "t.json"), "--logdir", str(tmp / "logs"),
            "--run_name", name, "--quiet"] + list(extra)


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _summary(tmp, name):
    return json.load(open(tmp / "logs" / name / runlog.SUMMARY_FILE))


def _epochs(summary):
    return [[e[k] for k in KEYS] for e in summary["epochs"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Re-selecting every epoch: the run left alone, the same run killed (SIGKILL) at
    KILL_AT_STEP, during epoch 3, a copy of the killed run's directory then (tmp/killed_copy,
    for the test that damages it), and the killed run resumed: (tmp, whole's summary, the
    resumed run's summary)."""
    tmp = tmp_path_factory.mktemp("resume")
    r = _run(_cmd(tmp, "whole"))
    assert r.returncode == 0, r.stderr[-2000:]
    killed = subprocess.run(_cmd(tmp, "killed"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=900,
                            env=dict(os.environ, **{FAULT_AT_STEP_ENV: str(KILL_AT_STEP)}))
    assert killed.returncode == -signal.SIGKILL
    assert len(_summary(tmp, "killed")["epochs"]) == 2  # killed in epoch 3, as meant
    shutil.copytree(tmp / "logs" / "killed", tmp / "killed_copy")  # before the resume
    resumed = _run(_cmd(tmp, "killed"))
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stderr[-2000:]
    return tmp, _summary(tmp, "whole"), _summary(tmp, "killed")


@pytest.mark.tf_versions
def test_a_killed_run_resumes_bit_for_bit_as_the_uninterrupted_one(runs):
    """Epochs, every selection (its mask and step, a re-selection each epoch across the
    restart too) equal to the uninterrupted run's, which profiled first; the cache never
    built; training time counted across the restart."""
    tmp, whole, again = runs
    # the uninterrupted run waited for its profiling: it counts it against itself
    assert whole["profiling_s"] > 0 and again["profiling_s"] == 0.0
    assert again["status"] == "finished" and len(again["epochs"]) == EPOCHS
    assert _epochs(whole) == _epochs(again)
    assert len(whole["selections"]) >= EPOCHS
    assert [(s["step"], s["mask"]) for s in whole["selections"]] == \
        [(s["step"], s["mask"]) for s in again["selections"]]
    assert not (tmp / "killed_copy" / "prefix_cache").exists()  # as the kill left it
    assert whole["prefix_cache"] is None and again["prefix_cache"] is None
    # train_time_s counts training only: it grows epoch by epoch across the restart
    times = [e["train_time_s"] for e in again["epochs"]]
    assert times == sorted(times) and again["train_time_s"] == times[-1]


@pytest.mark.tf_versions
def test_tensorboard_events_continue_without_repeated_steps(runs):
    from tensorboard.backend.event_processing import event_accumulator
    tmp, whole, _ = runs
    steps = {}
    for name in ("whole", "killed"):
        acc = event_accumulator.EventAccumulator(str(tmp / "logs" / name),
                                                 size_guidance={"tensors": 0})
        acc.Reload()
        steps[name] = {tag: [e.step for e in acc.Tensors(tag)]
                       for tag in (runlog.TEST_ACCURACY, runlog.NUM_SELECTED,
                                   runlog.PREDICTED_RATIO, runlog.SELECTION_IMAGE,
                                   runlog.CONFIG_TEXT, runlog.RESULT_TEXT)}
    assert steps["killed"] == steps["whole"]
    assert steps["whole"][runlog.TEST_ACCURACY] == [5, 10, 15]
    # the heat map at each selection and at the end; the config and the closing line once
    selections = [s["step"] for s in whole["selections"]]
    assert steps["whole"][runlog.SELECTION_IMAGE] == selections + [15]
    assert steps["whole"][runlog.CONFIG_TEXT] == [0] and steps["whole"][runlog.RESULT_TEXT] == [15]


def _truncate_newest(run_dir):
    """Cut the data file of the newest checkpoint the index names to half its size; its
    name."""
    import tensorflow as tf

    prefix = tf.train.get_checkpoint_state(str(run_dir / "checkpoints")).model_checkpoint_path
    (data,) = glob.glob(prefix + ".data-*")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    return os.path.basename(prefix)


def test_a_damaged_newest_checkpoint_costs_only_the_steps_since_the_one_before(runs):
    """Real file corruption of the killed run's newest checkpoint (epoch 2's, step 10): the
    resume says in one line that it reads epoch 1's instead, 5 steps earlier, and the run ends
    with the uninterrupted run's epochs; with --keep_checkpoints 3 it ends with three
    checkpoints.  (A flipped byte, every checkpoint damaged and the rotation after a fallback
    are tests/integration/test_resume.py's.)"""
    tmp, whole, _ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "truncated")
    assert _truncate_newest(tmp / "logs" / "truncated") == "ckpt-10"
    r = _run(_cmd(tmp, "truncated", "--keep_checkpoints", "3"))
    assert r.returncode == 0, r.stderr[-2000:]
    (warning,) = [line for line in r.stdout.splitlines() if "unreadable" in line]
    assert warning.startswith("warning: checkpoint ckpt-10 (")
    assert warning.endswith("is unreadable: resuming from ckpt-5 instead, 5 steps earlier")
    assert f"resuming {tmp / 'logs' / 'truncated'} from ckpt-5: epoch 2 of {EPOCHS}" in r.stdout
    assert _epochs(whole) == _epochs(_summary(tmp, "truncated"))
    kept = {f for f in os.listdir(tmp / "logs" / "truncated" / "checkpoints")
            if f.endswith(".sums.json")}
    assert kept == {f"ckpt-{step}.sums.json" for step in (5, 10, 15)}
