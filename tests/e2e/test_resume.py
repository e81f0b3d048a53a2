"""Resuming a run (checkpoint.py): a run killed with SIGKILL and started again ends exactly as
the same run never interrupted, uncached (the paper's protocol) and with the prefix cache
serving, and from the checkpoint before when its newest is damaged.  What a resume refuses
(other settings, a finished run, every checkpoint damaged) and --resume false are checked in
this process: tests/unit/test_resume.py and tests/integration/test_resume.py."""
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
UNCACHED = ("--cache_frozen_prefix", "false")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Where the runs' timing table goes: the first run profiles it there, every later run of
    the module reads it (one profiling for all)."""
    return tmp_path_factory.mktemp("table") / "t.json"


def _cmd(tmp, table, name, *extra):
    # smallcnn: augmentation and dropout draw random numbers, which must continue as well;
    # economy off: 15 steps would pay for no selection's compile, and the run would train every
    # tensor without re-selecting
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", "smallcnn",
            "--weights", "none", "--dataset_name", "synthetic", "--input_size", "16",
            "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", str(EPOCHS), "--steps_per_epoch", "5", "--interval", "1",
            "--rho", "0.7", "--rho_feedback", "false", "--economy", "false", "--seed", "3",
            "--timing_table", str(table), "--logdir", str(tmp / "logs"),
            "--run_name", name, "--quiet"] + list(extra)


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _summary(tmp, name):
    return json.load(open(tmp / "logs" / name / runlog.SUMMARY_FILE))


def _epochs(summary):
    return [[e[k] for k in KEYS] for e in summary["epochs"]]


def _whole_killed_resumed(tmp, table, *extra):
    """The run left alone, the same run killed (SIGKILL) at KILL_AT_STEP, a copy of the killed
    run's directory (tmp/killed_copy, for the tests that damage it), the listing of its prefix
    cache's directory then (None: none), and the resumed run: (whole's summary, the resumed
    run's summary, the listing, the resumed CompletedProcess)."""
    r = _run(_cmd(tmp, table, "whole", *extra))
    assert r.returncode == 0, r.stderr[-2000:]
    killed = subprocess.run(_cmd(tmp, table, "killed", *extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=900,
                            env=dict(os.environ, **{FAULT_AT_STEP_ENV: str(KILL_AT_STEP)}))
    assert killed.returncode == -signal.SIGKILL
    assert len(_summary(tmp, "killed")["epochs"]) == 2  # killed in epoch 3, as meant
    cache_dir = tmp / "logs" / "killed" / "prefix_cache"
    stored = os.listdir(cache_dir) if cache_dir.exists() else None
    shutil.copytree(tmp / "logs" / "killed", tmp / "killed_copy")  # before the resume
    resumed = _run(_cmd(tmp, table, "killed", *extra))
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stderr[-2000:]
    assert "cannot be put back" not in resumed.stdout + resumed.stderr
    return _summary(tmp, "whole"), _summary(tmp, "killed"), stored, resumed


@pytest.fixture(scope="module")
def runs(tmp_path_factory, table):
    """The paper's protocol (--cache_frozen_prefix false), re-selecting every epoch: run
    uninterrupted, and the same run killed (SIGKILL) during epoch 3, then resumed."""
    tmp = tmp_path_factory.mktemp("resume")
    return (tmp, *_whole_killed_resumed(tmp, table, *UNCACHED))


def test_a_killed_run_resumes_bit_for_bit_as_the_uninterrupted_one(runs):
    """Epochs, every selection (its mask and step, a re-selection each epoch across the
    restart too) equal to the uninterrupted run's; the cache never built; training time
    counted across the restart."""
    _, whole, again, stored, _ = runs
    assert again["status"] == "finished" and len(again["epochs"]) == EPOCHS
    assert _epochs(whole) == _epochs(again)
    assert len(whole["selections"]) >= EPOCHS
    assert [(s["step"], s["mask"]) for s in whole["selections"]] == \
        [(s["step"], s["mask"]) for s in again["selections"]]
    assert stored is None
    assert whole["prefix_cache"] is None and again["prefix_cache"] is None
    # train_time_s counts training only: it grows epoch by epoch across the restart
    times = [e["train_time_s"] for e in again["epochs"]]
    assert times == sorted(times) and again["train_time_s"] == times[-1]


def test_tensorboard_events_continue_without_repeated_steps(runs):
    from tensorboard.backend.event_processing import event_accumulator
    tmp, whole, *_ = runs
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


def test_a_damaged_newest_checkpoint_costs_only_the_steps_since_the_one_before(runs, table):
    """Real file corruption of the killed run's newest checkpoint (epoch 2's, step 10): the
    resume says in one line that it reads epoch 1's instead, 5 steps earlier, and the run ends
    with the uninterrupted run's epochs; with --keep_checkpoints 3 it ends with three
    checkpoints.  (A flipped byte, every checkpoint damaged and the rotation after a fallback
    are tests/integration/test_resume.py's.)"""
    tmp, whole, *_ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "truncated")
    assert _truncate_newest(tmp / "logs" / "truncated") == "ckpt-10"
    r = _run(_cmd(tmp, table, "truncated", *UNCACHED, "--keep_checkpoints", "3"))
    assert r.returncode == 0, r.stderr[-2000:]
    (warning,) = [line for line in r.stdout.splitlines() if "unreadable" in line]
    assert warning.startswith("warning: checkpoint ckpt-10 (")
    assert warning.endswith("is unreadable: resuming from ckpt-5 instead, 5 steps earlier")
    assert f"resuming {tmp / 'logs' / 'truncated'} from ckpt-5: epoch 2 of {EPOCHS}" in r.stdout
    assert _epochs(whole) == _epochs(_summary(tmp, "truncated"))
    kept = {f for f in os.listdir(tmp / "logs" / "truncated" / "checkpoints")
            if f.endswith(".sums.json")}
    assert kept == {f"ckpt-{step}.sums.json" for step in (5, 10, 15)}


def test_a_cached_run_killed_mid_epoch_resumes_bit_for_bit(tmp_path, table):
    """The default, with the prefix cache serving: 40 training images, so that each epoch
    draws the same ones, two augmented views of each stored, one selection for the run.  Killed
    (SIGKILL) in epoch 3, after the checkpoint that wrote the store down: the resumed run reads
    the store back and ends as the run left alone, epoch by epoch, with the same steps served
    from the cache."""
    whole, again, stored, _ = _whole_killed_resumed(
        tmp_path, table, "--num_train", "40", "--interval", "10", "--rho", "0.6",
        "--num_epochs", "5")
    assert _epochs(whole) == _epochs(again)
    assert any(f.endswith(".bin") for f in stored) and "index-10.npz" in stored
    assert whole["ran"] == again["ran"]
    counts = ("fill_steps", "served_steps", "uncached_steps")
    assert whole["prefix_cache"]["served_steps"] > 0
    assert [whole["prefix_cache"][k] for k in counts] == [again["prefix_cache"][k] for k in counts]
