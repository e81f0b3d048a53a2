"""A full disk and files cut short, in this process (runs/disk.py): ENOSPC on each writer of a
run (a checkpoint, TensorBoard's events, summary.json, the timing table; the prefix cache's
store is test_prefix_cache.py's) stops it in one line naming the disk and the last good
checkpoint, leaves no temporary file, and the same run resumes to the per-epoch results of the
run never stopped; a truncated summary.json, config.json or timing table does not change a
resumed run's results.  The faults are injected (an OSError or TensorFlow's
ResourceExhaustedError, as a full disk raises them), except in the test that fills a real small
tmpfs, which needs root and is skipped elsewhere."""
import errno
import json
import os
import signal
import subprocess

import pytest
import tensorflow as tf

from elastictrainer import config, runlog
from elastictrainer.errors import RunError
from elastictrainer.profiler import run as prun
from elastictrainer.errors import UserError
from elastictrainer.runs import checkpoint, disk, loop, recorder, room

from helpers import smallcnn_scripted_table

NO_SPACE = "No space left on device"
KEYS = ("epoch", "test_accuracy", "test_loss", "train_loss", "train_accuracy", "selected")


def cfg(tmp, name, **kw):
    """An elastic run of smallcnn on synthetic data: 3 epochs of 3 steps, re-selecting every
    epoch; no closed loop and no prefix cache, so that a resume repeats it exactly."""
    base = dict(model_name="smallcnn", dataset_name="synthetic", input_size=16, batch_size=8,
                weights="none", optimizer="adam", learning_rate=0.003, num_epochs=3,
                steps_per_epoch=3, interval=1, rho=0.7, rho_feedback=False, economy=False,
                cache_frozen_prefix=False, seed=3, timing_table=str(tmp / "table.json"),
                logdir=str(tmp / "logs"), run_name=name, progress=False, energy="none",
                checkpoint_minutes=0)
    return config.Config(**{**base, **kw})


def table_for(tmp, **times):
    """The shared timing table of cfg's runs, its times scripted (helpers.scripted_table)."""
    return smallcnn_scripted_table(tmp / "table.json", **times)


def epochs(summary):
    return [[e[k] for k in KEYS] for e in summary["epochs"]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run never stopped: its per-epoch results."""
    tmp = tmp_path_factory.mktemp("reference")
    table_for(tmp)
    summary = loop.run(cfg(tmp, "whole"), log=lambda m: None)
    assert summary["status"] == "finished" and len(summary["epochs"]) == 3
    return epochs(summary)


@pytest.fixture
def tmp(tmp_path):
    table_for(tmp_path)
    return tmp_path


def full(*_, **__):
    raise OSError(errno.ENOSPC, NO_SPACE)


def tf_full(*_, **__):
    raise tf.errors.ResourceExhaustedError(None, None, f"/x/events.out.tfevents; {NO_SPACE}")


def stops_then_resumes(tmp, name, reference, monkeypatch, patch):
    """Run with `patch` (which makes a writer fail once the run is under way) applied, check
    the clean stop, then run again with the disk freed and check the result.  Returns the
    stop's line."""
    out = tmp / "logs" / name
    with monkeypatch.context() as m:
        patch(m)
        with pytest.raises(RunError) as stop:
            loop.run(cfg(tmp, name), log=lambda m: None)
    line = str(stop.value)
    assert "\n" not in line and line.startswith("no space left on device on ")
    assert "free space and run the same command to resume" in line
    assert f"the last good checkpoint is {out / 'checkpoints' / 'ckpt-3'}" in line
    leftovers = [p for p in out.rglob("*") if p.name.endswith((".tmp", "_temp"))
                 or p.name.startswith("tmp-")]
    assert leftovers == []
    summary = runlog.read_summary(out)
    assert summary["status"] == "failed" and summary["error"] == line
    lines = []
    resumed = loop.run(cfg(tmp, name), log=lines.append)
    assert any(m.startswith(f"resuming {out}") for m in lines)
    assert resumed["status"] == "finished" and epochs(resumed) == reference
    return line


def fail_from_call(m, owner, name, replacement, after):
    """Make owner.name raise (replacement) from its `after`+1-th call on."""
    original = getattr(owner, name)
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)
    m.setattr(owner, name, wrapped)


def test_a_full_disk_at_a_checkpoint_stops_cleanly_and_resumes(tmp, reference, monkeypatch):
    def save_fails(self, state, step):
        # as TensorFlow leaves it: the checkpoint's temporary directory, half written
        part = os.path.join(self.directory, f"ckpt-{step}_temp")
        os.makedirs(part, exist_ok=True)
        open(os.path.join(part, "part-00000-of-00001.data-00000-of-00001"), "wb").close()
        raise tf.errors.ResourceExhaustedError(None, None, f"{part}/part; {NO_SPACE}")

    # the first checkpoint (epoch 1's end) is saved; the second meets the full disk
    stops_then_resumes(tmp, "ckpt", reference, monkeypatch, lambda m: fail_from_call(
        m, checkpoint.RunCheckpoint, "save", save_fails, after=1))


def test_a_full_disk_under_the_events_stops_cleanly_and_resumes(tmp, reference, monkeypatch):
    # TensorBoard's writer raises at a flush (the loop flushes before each checkpoint)
    stops_then_resumes(tmp, "events", reference, monkeypatch, lambda m: fail_from_call(
        m, recorder.Recorder, "flush", tf_full, after=1))


def test_a_full_disk_at_summary_json_stops_cleanly_and_resumes(tmp, reference, monkeypatch):
    def half_then_full(obj, f, **kw):
        if len(obj.get("epochs", ())) >= 2:  # summary.json at epoch 2: half written, full
            f.write(json.dumps(obj)[:50])
            full()
        return dump(obj, f, **kw)

    dump = json.dump
    stops_then_resumes(tmp, "summary", reference, monkeypatch,
                       lambda m: m.setattr(runlog.json, "dump", half_then_full))


def test_a_full_disk_writing_the_timing_table_stops_before_the_run(tmp_path, monkeypatch):
    """Profiling's table cannot be written: one line, no table and no temporary file left."""
    scripted = json.loads(open(table_for(tmp_path)).read())
    os.remove(tmp_path / "table.json")
    monkeypatch.setattr(prun, "profile_model",
                        lambda *a, **k: dict(scripted, profiling_phases_s={}))
    monkeypatch.setattr(runlog.json, "dump", full)
    with pytest.raises(RunError) as stop:
        loop.run(cfg(tmp_path, "table", profile_in="process"), log=lambda m: None)
    assert str(stop.value).startswith("no space left on device on ")
    assert str(stop.value).endswith("while setting the run up: free space and run the same "
                                    "command")
    assert sorted(os.listdir(tmp_path)) == ["logs"]


def interrupted(tmp, name):
    """The run stopped after its first epoch (Ctrl-C), its checkpoint saved."""
    def ctrl_c(msg):
        if msg.startswith("epoch 1:"):
            os.kill(os.getpid(), signal.SIGINT)

    assert loop.run(cfg(tmp, name), log=ctrl_c)["status"] == "interrupted"
    return tmp / "logs" / name


def test_truncated_summary_config_and_timing_table_do_not_change_a_resume(tmp, reference):
    out = interrupted(tmp, "cut")
    for path in (out / runlog.SUMMARY_FILE, out / runlog.CONFIG_FILE, tmp / "table.json"):
        text = path.read_text()
        path.write_text(text[:len(text) // 2])
    # the shared table profiled again meanwhile, with other times: the run keeps its own
    table_path = table_for(tmp, t_fp_ms=60.0)
    assert json.load(open(table_path))["t_fp_ms"] == 60.0
    lines = []
    resumed = loop.run(cfg(tmp, "cut"), log=lines.append)
    assert any("config.json is unreadable" in m for m in lines)
    assert resumed["status"] == "finished" and epochs(resumed) == reference
    assert runlog.read_config(out)["run_name"] == "cut"  # written again


def test_a_truncated_shared_table_is_profiled_again_with_a_warning(tmp_path, monkeypatch):
    path = table_for(tmp_path)
    scripted = json.load(open(path))
    open(path, "w").write(json.dumps(scripted)[:100])
    monkeypatch.setattr(prun, "profile_model",
                        lambda *a, **k: dict(scripted, profiling_phases_s={}))
    lines = []
    summary = loop.run(cfg(tmp_path, "again", num_epochs=1, profile_in="process"),
                       log=lines.append)
    assert summary["status"] == "finished"
    assert [m for m in lines if m.startswith("warning:")] == [
        f"warning: the timing table {path} is cut short or not JSON; profiling it again"]
    assert json.load(open(path)) == json.load(
        open(tmp_path / "logs" / "again" / disk.RUN_TABLE_FILE))


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MB tmpfs at tmp_path/disk (root only: skipped where it cannot be mounted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_disk_stops_cleanly_and_runs_again(small_disk, tmp, reference):
    """A real tmpfs filled once epoch 1 is done: TensorFlow's own write fails, not an injected
    one; freeing the filler lets the same command end with the uninterrupted run's results."""
    run = cfg(tmp, "real", logdir=str(small_disk / "logs"))
    filler = small_disk / "filler"

    def fill(msg):
        if msg.startswith("epoch 1:"):
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError as e:
                    assert e.errno == errno.ENOSPC

    with pytest.raises(RunError) as stop:
        loop.run(run, log=fill)
    line = str(stop.value)
    assert line.startswith(f"no space left on device on {small_disk} ")
    # the first write after the filler is epoch 1's summary.json, before its checkpoint
    assert line.endswith("no checkpoint was saved yet; free space and run the same command to "
                         "start it again")
    out = small_disk / "logs" / "real"
    assert [p for p in out.rglob("*") if p.name.endswith((".tmp", "_temp"))] == []
    os.remove(filler)
    resumed = loop.run(run, log=lambda m: None)
    assert resumed["status"] == "finished" and epochs(resumed) == reference


def test_a_run_that_will_not_fit_is_refused_or_warned_before_it_starts(tmp, monkeypatch):
    """The free space is a function the test gives: checkpoints that do not fit refuse the run
    before its table is read; room for them but not for the events is one warning line."""
    from elastictrainer.models.build import build_sized

    model, _, _ = build_sized("smallcnn", 16, 10, "none", log=lambda m: None, progress=False)
    parts = room.estimate(model, cfg(tmp, "x"), elastic=True)
    weights = room.variable_bytes(model.weights)
    trainable = room.variable_bytes(model.trainable_weights)
    assert parts["checkpoints"] >= 3 * (weights + 2 * trainable)  # Adam: two slots
    assert parts["events"] > 0 and parts["summary"] > 0
    read = []
    monkeypatch.setattr(disk, "table_to_read", lambda *a: read.append(a) or a[0])
    monkeypatch.setattr(room, "free_bytes", lambda path: parts["checkpoints"] - 1)
    with pytest.raises(UserError) as refused:
        loop.run(cfg(tmp, "tight"), log=lambda m: None)
    assert "its checkpoints do not fit; free space or pass another --logdir" in str(
        refused.value) and "\n" not in str(refused.value)
    assert read == []  # refused before the timing table
    monkeypatch.setattr(room, "free_bytes", lambda path: parts["checkpoints"] + 1)
    lines = []
    summary = loop.run(cfg(tmp, "warned", num_epochs=1), log=lines.append)
    assert summary["status"] == "finished"
    warned = [m for m in lines if m.startswith("warning:")]
    assert len(warned) == 1 and "fewer --num_epochs" in warned[0]
    monkeypatch.setattr(room, "free_bytes", lambda path: sum(parts.values()))
    lines.clear()
    loop.run(cfg(tmp, "roomy", num_epochs=1), log=lines.append)
    assert not [m for m in lines if m.startswith("warning:")]
