"""Resuming a run (checkpoint.py): a run killed with SIGKILL and started again ends exactly as
the same run never interrupted, from the checkpoint before when its newest is damaged; other
settings, and checkpoints all damaged, are refused in one line."""
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


def _cmd(tmp, name, *extra):
    # smallcnn: augmentation and dropout draw random numbers, which must continue as well;
    # economy off: 20 steps would pay for no selection's compile, and the run would train every
    # tensor without re-selecting
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", "smallcnn",
            "--weights", "none", "--dataset_name", "synthetic", "--input_size", "16",
            "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", "4", "--steps_per_epoch", "5", "--interval", "1", "--rho", "0.7",
            "--rho_feedback", "false", "--economy", "false", "--seed", "3",
            "--timing_table", str(tmp / "t.json"), "--logdir", str(tmp / "logs"),
            "--run_name", name, "--quiet"] + list(extra)


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _summary(tmp, name):
    return json.load(open(tmp / "logs" / name / runlog.SUMMARY_FILE))


def _epochs_done(tmp, name):
    try:
        return len(_summary(tmp, name)["epochs"])
    except (OSError, ValueError, KeyError):
        return 0


# The kill comes as the killed run is about to run this global step (counted from 0): two epochs
# of 5 steps are checkpointed, and epoch 3's selection and first two steps are done, then lost.
KILL_AT_STEP = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and the same run killed (SIGKILL) during epoch 3, then resumed."""
    tmp = tmp_path_factory.mktemp("resume")
    r = _run(_cmd(tmp, "whole"))
    assert r.returncode == 0, r.stderr[-2000:]
    killed = subprocess.run(_cmd(tmp, "killed"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=900,
                            env=dict(os.environ, **{FAULT_AT_STEP_ENV: str(KILL_AT_STEP)}))
    assert killed.returncode == -signal.SIGKILL
    assert 2 <= _epochs_done(tmp, "killed") < 4
    shutil.copytree(tmp / "logs" / "killed", tmp / "killed_copy")  # before the resume
    resumed = _run(_cmd(tmp, "killed"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    return tmp, resumed


def test_a_killed_run_resumes_and_ends_as_the_uninterrupted_one(runs):
    tmp, resumed = runs
    assert "resuming" in resumed.stdout
    whole, again = _summary(tmp, "whole"), _summary(tmp, "killed")
    assert again["status"] == "finished" and len(again["epochs"]) == 4
    keys = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")
    assert [[e[k] for k in keys] for e in whole["epochs"]] == \
        [[e[k] for k in keys] for e in again["epochs"]]
    assert len(whole["selections"]) >= 4  # a re-selection each epoch, across the restart too
    assert [s["mask"] for s in whole["selections"]] == [s["mask"] for s in again["selections"]]
    assert [s["step"] for s in whole["selections"]] == [s["step"] for s in again["selections"]]
    # train_time_s counts training only: it grows epoch by epoch across the restart
    times = [e["train_time_s"] for e in again["epochs"]]
    assert times == sorted(times) and again["train_time_s"] == times[-1]


def test_tensorboard_events_continue_without_repeated_steps(runs):
    from tensorboard.backend.event_processing import event_accumulator
    tmp, _ = runs
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
    assert steps["whole"][runlog.TEST_ACCURACY] == [5, 10, 15, 20]
    # the heat map at each selection and at the end; the config and the closing line once
    selections = [s["step"] for s in _summary(tmp, "whole")["selections"]]
    assert steps["whole"][runlog.SELECTION_IMAGE] == selections + [20]
    assert steps["whole"][runlog.CONFIG_TEXT] == [0] and steps["whole"][runlog.RESULT_TEXT] == [20]


def test_other_settings_are_refused_in_one_line(runs):
    tmp, _ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "other")
    r = _run(_cmd(tmp, "other", "--rho", "0.8"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--rho 0.7, not 0.8" in r.stderr


def _damage(run_dir, how, newest_only=True):
    """Damage the data file of the newest checkpoint the index names (every one it names with
    newest_only false): cut to half its size, or one byte in its middle flipped."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(run_dir / "checkpoints"))
    prefixes = [state.model_checkpoint_path] if newest_only else state.all_model_checkpoint_paths
    for prefix in prefixes:
        (data,) = glob.glob(prefix + ".data-*")
        size = os.path.getsize(data)
        with open(data, "r+b") as f:
            if how == "truncated":
                f.truncate(size // 2)
            else:
                f.seek(size // 2)
                byte = f.read(1)
                f.seek(size // 2)
                f.write(bytes([byte[0] ^ 0x01]))
    return [os.path.basename(p) for p in prefixes]


@pytest.mark.parametrize("how", ["truncated", "bit flipped"])
def test_a_damaged_newest_checkpoint_costs_only_the_steps_since_the_one_before(runs, how):
    """Real file corruption of the killed run's newest checkpoint (epoch 2's, step 10): the
    resume says in one line that it reads epoch 1's instead, 5 steps earlier, and the run ends
    with the uninterrupted run's epochs.  The truncated one runs with --keep_checkpoints 3 and
    ends with three checkpoints."""
    tmp, _ = runs
    name = "truncated" if how == "truncated" else "flipped"
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / name)
    assert _damage(tmp / "logs" / name, how) == ["ckpt-10"]
    keep = ("--keep_checkpoints", "3") if how == "truncated" else ()
    r = _run(_cmd(tmp, name, *keep))
    assert r.returncode == 0, r.stderr[-2000:]
    (warning,) = [line for line in r.stdout.splitlines() if "unreadable" in line]
    assert warning.startswith("warning: checkpoint ckpt-10 (")
    assert warning.endswith("is unreadable: resuming from ckpt-5 instead, 5 steps earlier")
    assert f"resuming {tmp / 'logs' / name} from ckpt-5: epoch 2 of 4" in r.stdout
    keys = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")
    assert [[e[k] for k in keys] for e in _summary(tmp, "whole")["epochs"]] == \
        [[e[k] for k in keys] for e in _summary(tmp, name)["epochs"]]
    kept = sorted(f for f in os.listdir(tmp / "logs" / name / "checkpoints")
                  if f.endswith(".sums.json"))
    expected = ["ckpt-10", "ckpt-15", "ckpt-20"] if keep else ["ckpt-15", "ckpt-20"]
    assert kept == [f"{c}.sums.json" for c in expected]


def test_every_checkpoint_damaged_is_refused_in_one_line(runs):
    """Real file corruption: both of the killed run's checkpoints truncated."""
    tmp, _ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "broken")
    assert _damage(tmp / "logs" / "broken", "truncated", newest_only=False) == \
        ["ckpt-5", "ckpt-10"]
    r = _run(_cmd(tmp, "broken"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "ckpt-10: the checkpoint is unreadable" in r.stderr
    assert "nor can the 1 before it; start the run over with --resume false" in r.stderr


def test_a_finished_run_is_not_run_again_and_resume_false_starts_over(runs):
    tmp, _ = runs
    r = _run(_cmd(tmp, "whole"))
    assert r.returncode == 2 and "already holds a finished run" in r.stderr
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "over")
    r = _run(_cmd(tmp, "over", "--resume", "false"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming" not in r.stdout and "starting" in r.stdout
    assert [e["test_loss"] for e in _summary(tmp, "over")["epochs"]] == \
        [e["test_loss"] for e in _summary(tmp, "whole")["epochs"]]


def _whole_killed_resumed(tmp, *extra):
    """The run left alone, the same run killed (SIGKILL) at KILL_AT_STEP, the listing of its
    prefix cache's directory then (None: none), and the resumed run's summaries."""
    r = _run(_cmd(tmp, "whole", *extra))
    assert r.returncode == 0, r.stderr[-2000:]
    killed = subprocess.run(_cmd(tmp, "killed", *extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=900,
                            env=dict(os.environ, **{FAULT_AT_STEP_ENV: str(KILL_AT_STEP)}))
    assert killed.returncode == -signal.SIGKILL
    cache_dir = tmp / "logs" / "killed" / "prefix_cache"
    stored = os.listdir(cache_dir) if cache_dir.exists() else None
    resumed = _run(_cmd(tmp, "killed", *extra))
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stderr[-2000:]
    assert "cannot be put back" not in resumed.stdout + resumed.stderr
    whole, again = _summary(tmp, "whole"), _summary(tmp, "killed")
    keys = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")
    assert [[e[k] for k in keys] for e in whole["epochs"]] == \
        [[e[k] for k in keys] for e in again["epochs"]]
    return whole, again, stored


def test_an_uncached_run_resumes_bit_for_bit(tmp_path):
    """The paper's protocol (--cache_frozen_prefix false) resumes as exactly as the default
    does: epochs and selections equal to the uninterrupted run's, the cache never built."""
    whole, again, stored = _whole_killed_resumed(tmp_path, "--cache_frozen_prefix", "false")
    assert stored is None
    assert whole["prefix_cache"] is None and again["prefix_cache"] is None
    assert [(s["step"], s["mask"]) for s in whole["selections"]] == \
        [(s["step"], s["mask"]) for s in again["selections"]]


def test_a_cached_run_killed_mid_epoch_resumes_bit_for_bit(tmp_path):
    """The default, with the prefix cache serving: 40 training images, so that each epoch
    draws the same ones, two augmented views of each stored, one selection for the run.  Killed
    (SIGKILL) in epoch 3, after the checkpoint that wrote the store down: the resumed run reads
    the store back and ends as the run left alone, epoch by epoch, with the same steps served
    from the cache."""
    whole, again, stored = _whole_killed_resumed(
        tmp_path, "--num_train", "40", "--interval", "10", "--rho", "0.6", "--num_epochs", "5")
    assert any(f.endswith(".bin") for f in stored) and "index-10.npz" in stored
    assert whole["ran"] == again["ran"]
    counts = ("fill_steps", "served_steps", "uncached_steps")
    assert whole["prefix_cache"]["served_steps"] > 0
    assert [whole["prefix_cache"][k] for k in counts] == [again["prefix_cache"][k] for k in counts]
