"""Resuming a run (checkpoint.py): a run killed with SIGKILL and started again ends exactly as
the same run never interrupted; other settings and broken checkpoints are refused in one line."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from elastictrainer import runlog
from elastictrainer.run_hooks import FAULT_AT_STEP_ENV

from helpers import ROOT


def _cmd(tmp, name, *extra):
    # smallcnn: augmentation and dropout draw random numbers, which must continue as well
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", "smallcnn",
            "--weights", "none", "--dataset_name", "synthetic", "--input_size", "16",
            "--batch_size", "8", "--optimizer", "adam", "--learning_rate", "0.003",
            "--num_epochs", "4", "--steps_per_epoch", "5", "--interval", "1", "--rho", "0.7",
            "--rho_feedback", "false", "--seed", "3", "--timing_table", str(tmp / "t.json"),
            "--logdir", str(tmp / "logs"), "--run_name", name, "--quiet"] + list(extra)


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
                                   runlog.PREDICTED_RATIO)}
    assert steps["killed"] == steps["whole"]
    assert steps["whole"][runlog.TEST_ACCURACY] == [5, 10, 15, 20]


def test_other_settings_are_refused_in_one_line(runs):
    tmp, _ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "other")
    r = _run(_cmd(tmp, "other", "--rho", "0.8"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--rho 0.7, not 0.8" in r.stderr


def test_a_truncated_checkpoint_is_refused_in_one_line(runs):
    tmp, _ = runs
    shutil.copytree(tmp / "killed_copy", tmp / "logs" / "broken")
    import tensorflow as tf

    # the checkpoint a resume reads (the index's), not the newest file: a kill while saving
    # leaves a newer data file that the index does not name yet
    latest = tf.train.latest_checkpoint(str(tmp / "logs" / "broken" / "checkpoints"))
    data = glob.glob(latest + ".data-*")[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    r = _run(_cmd(tmp, "broken"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unreadable" in r.stderr
    assert "--resume false" in r.stderr


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


def test_truncate_events_drops_what_came_after_the_checkpoint(tmp_path):
    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in range(5):
            tf.summary.scalar("x", float(step), step=step)
    writer.close()
    # the events' wall times stamped at known seconds: the file-version record at 1000, step k
    # at 1001 + k; the checkpoint between steps 2 and 3
    (path,) = tmp_path.glob("events.out.tfevents*")
    records = [event_pb2.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    assert [e.step for e in records if e.HasField("summary")] == [0, 1, 2, 3, 4]
    with tf.io.TFRecordWriter(str(path)) as w:
        for event in records:
            event.wall_time = 1001.0 + event.step if event.HasField("summary") else 1000.0
            w.write(event.SerializeToString())
    cut = 1003.5
    runlog.truncate_events(str(tmp_path), cut)
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("x")] == [0, 1, 2]


# ----------------------------------------------------------------- the loop state's version
def _checkpoint(run_dir, seed=0):
    """A RunCheckpoint over a tiny model, its optimizer and a data iterator, as the loop's."""
    import tensorflow as tf

    from helpers import tiny_model
    from elastictrainer import engine
    from elastictrainer.checkpoint import RunCheckpoint

    tf.keras.utils.set_random_seed(seed)
    model = tiny_model()
    optimizer = engine.make_optimizer("sgd", 0.01, 5e-4, total_steps=10)
    engine.prepare_optimizer(optimizer, model.trainable_weights)
    data = iter(tf.data.Dataset.range(100))
    return RunCheckpoint(str(run_dir), model, optimizer, {"train_data": data}), model


STATE = {"loop": {"epoch": 1, "step_in_epoch": 3}, "summary": {"epochs": []}, "elastic": None}


def _save_unversioned(ckpt, state, step):
    """A checkpoint whose loop state carries no version, as an older ElasticTrainer's does."""
    ckpt._state.assign(json.dumps(state))
    ckpt._manager.save(checkpoint_number=step)


def test_a_checkpoint_round_trips_its_state_with_the_version(tmp_path):
    from elastictrainer import checkpoint

    ckpt, model = _checkpoint(tmp_path)
    ckpt.save(STATE, 7)
    again, fresh = _checkpoint(tmp_path, seed=1)
    assert again.restore() == {"version": checkpoint.CHECKPOINT_VERSION, **STATE}
    # the other seed's weights were replaced by the saved ones
    assert all((a == b).all() for a, b in zip(model.get_weights(), fresh.get_weights()))
    assert checkpoint.migrate_state(STATE) == again.restore()


def test_a_checkpoint_without_a_version_restores_as_the_current_one(tmp_path):
    from elastictrainer import checkpoint

    ckpt, _ = _checkpoint(tmp_path)
    _save_unversioned(ckpt, STATE, 7)
    assert _checkpoint(tmp_path)[0].restore() == {"version": checkpoint.CHECKPOINT_VERSION,
                                                  **STATE}


def test_a_checkpoint_of_a_newer_state_version_is_refused_in_one_line(tmp_path, monkeypatch):
    from elastictrainer import checkpoint
    from elastictrainer.common import UserError

    current = checkpoint.CHECKPOINT_VERSION
    ckpt, _ = _checkpoint(tmp_path)
    monkeypatch.setattr(checkpoint, "CHECKPOINT_VERSION", current + 1)  # a newer ElasticTrainer
    ckpt.save(STATE, 7)
    monkeypatch.setattr(checkpoint, "CHECKPOINT_VERSION", current)
    with pytest.raises(UserError) as e:
        _checkpoint(tmp_path)[0].restore()
    assert str(e.value) == (f"cannot resume {tmp_path}: its checkpoint has state version "
                            f"{current + 1}, newer than this ElasticTrainer reads ({current}); "
                            f"upgrade, or start over with --resume false")
    _save_unversioned(ckpt, dict(STATE, version="1"), 8)
    with pytest.raises(UserError, match="state version '1' is not a positive integer"):
        _checkpoint(tmp_path)[0].restore()


def test_a_run_checkpointed_before_the_version_was_recorded_resumes(tmp_path, monkeypatch):
    from elastictrainer import checkpoint, config, loop

    def interrupt(msg):
        if msg.startswith("epoch 1:"):
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C

    cfg = config.Config(model_name="smallcnn", dataset_name="synthetic", input_size=16,
                        batch_size=8, weights="none", num_epochs=2, steps_per_epoch=2,
                        train_type="full_training", logdir=str(tmp_path), run_name="r",
                        progress=False)
    with monkeypatch.context() as m:
        m.setattr(checkpoint.RunCheckpoint, "save",
                  lambda self, state, step: _save_unversioned(self, state, step))
        assert loop.run(cfg, log=interrupt)["status"] == "interrupted"
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(tmp_path / "r" / "checkpoints"))
    (key,) = [k for k in reader.get_variable_to_shape_map() if k.startswith("loop_state")]
    assert "version" not in json.loads(reader.get_tensor(key))
    lines = []
    summary = loop.run(cfg, log=lines.append)
    assert any(line.startswith("resuming") for line in lines)
    assert summary["status"] == "finished" and len(summary["epochs"]) == 2
