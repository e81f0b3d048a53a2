"""Resuming in this process: the run's checkpoint round-trips its loop state with the state's
version (an unversioned one restores as the current version, a newer one is refused in one
line), a run checkpointed without that version resumes, the TensorBoard events written
after a checkpoint are dropped, and damaged checkpoints: a resume falls back to the newest
intact one and the saves after it rotate as before, a save that fails leaves no stray files."""
import json
import os
import signal

import pytest

from elastictrainer import runlog


pytestmark = pytest.mark.tf_versions


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
def _checkpoint(run_dir, seed=0, **kwargs):
    """A RunCheckpoint over a tiny model, its optimizer and a data iterator, as the loop's."""
    import tensorflow as tf

    from helpers import tiny_model
    from elastictrainer.flavors import optimizers
    from elastictrainer.runs.checkpoint import RunCheckpoint

    tf.keras.utils.set_random_seed(seed)
    model = tiny_model()
    optimizer = optimizers.make_optimizer("sgd", 0.01, 5e-4, total_steps=10)
    optimizers.prepare_optimizer(optimizer, model.trainable_weights)
    data = iter(tf.data.Dataset.range(100))
    return RunCheckpoint(str(run_dir), model, optimizer, {"train_data": data}, **kwargs), model


STATE = {"loop": {"epoch": 1, "step_in_epoch": 3}, "summary": {"epochs": []}, "elastic": None}


def _save_unversioned(ckpt, state, step):
    """A checkpoint whose loop state carries no version, as an older ElasticTrainer's does."""
    ckpt._state.assign(json.dumps(state))
    ckpt._manager.save(checkpoint_number=step)


def test_a_checkpoint_round_trips_its_state_with_the_version(tmp_path):
    from elastictrainer.runs import checkpoint

    ckpt, model = _checkpoint(tmp_path)
    ckpt.save(STATE, 7)
    again, fresh = _checkpoint(tmp_path, seed=1)
    assert again.restore() == {"version": checkpoint.CHECKPOINT_VERSION, **STATE}
    # the other seed's weights were replaced by the saved ones
    assert all((a == b).all() for a, b in zip(model.get_weights(), fresh.get_weights()))
    assert checkpoint.migrate_state(STATE) == again.restore()


def test_a_checkpoint_without_a_version_restores_as_the_current_one(tmp_path):
    from elastictrainer.runs import checkpoint

    ckpt, _ = _checkpoint(tmp_path)
    _save_unversioned(ckpt, STATE, 7)
    assert _checkpoint(tmp_path)[0].restore() == {"version": checkpoint.CHECKPOINT_VERSION,
                                                  **STATE}


def test_a_checkpoint_of_a_newer_state_version_is_refused_in_one_line(tmp_path, monkeypatch):
    from elastictrainer.runs import checkpoint
    from elastictrainer.errors import UserError

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
    from elastictrainer import config
    from elastictrainer.runs import checkpoint
    from elastictrainer.runs import loop

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


# ------------------------------------------------------------------- damaged checkpoints
def _train_between_saves(run_dir, steps, **kwargs):
    """A RunCheckpoint saved at each of `steps`, weights, optimizer (slots and iterations) and
    iterator moved on before each save; and what each checkpoint holds: {step: (weights,
    momentum slots, iterations, the iterator's next value)}."""
    import tensorflow as tf

    ckpt, model = _checkpoint(run_dir, **kwargs)
    opt, data = ckpt._ckpt.optimizer, ckpt._ckpt.train_data
    held = {}
    for k, step in enumerate(steps):
        grads = [tf.fill(w.shape, 0.1 * (k + 1)) for w in model.trainable_weights]
        opt.apply_gradients(zip(grads, model.trainable_weights))
        next(data)
        ckpt.save(dict(STATE, at=step), step)
        held[step] = ([w.numpy() for w in model.weights], _slots(opt),
                      int(opt.iterations.numpy()), k + 1)
    return ckpt, held


def _slots(opt):
    """The optimizer's variables (its momentum slots, and the iteration count)."""
    return [v.numpy() for v in opt.variables]


def _holds(ckpt, model, expected):
    """The objects `ckpt` restored into hold exactly `expected` (see _train_between_saves)."""
    weights, slots, iterations, next_value = expected
    opt = ckpt._ckpt.optimizer
    assert all((a == b).all() for a, b in zip(weights, [w.numpy() for w in model.weights]))
    assert len(slots) > len(weights) // 2  # a momentum slot per trainable weight
    assert all((a == b).all() for a, b in zip(slots, _slots(opt)))
    assert int(opt.iterations.numpy()) == iterations
    assert int(next(ckpt._ckpt.train_data).numpy()) == next_value


def _data_file(prefix):
    import glob
    (path,) = glob.glob(str(prefix) + ".data-*")
    return path


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _resume(run_dir, **kwargs):
    lines = []
    ckpt, model = _checkpoint(run_dir, seed=1, log=lines.append, **kwargs)
    return ckpt, model, ckpt.restore(), lines


@pytest.mark.parametrize("damage", ["truncated", "bit flipped"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, damage):
    """Real file corruption: the newest checkpoint's data file cut to half its size, or one
    byte in its middle flipped.  The resume reads the one before, says so in one line, and
    everything (weights, optimizer slots and iterations, the data iterator, the loop state) is
    that checkpoint's."""
    _, held = _train_between_saves(tmp_path, [100, 200])
    newest = tmp_path / "checkpoints" / "ckpt-200"
    (_truncate if damage == "truncated" else _flip_a_byte)(_data_file(newest))
    ckpt, model, state, lines = _resume(tmp_path)
    assert state["at"] == 100 and ckpt.restored.endswith("ckpt-100")
    _holds(ckpt, model, held[100])
    (line,) = lines
    assert line.startswith("warning: checkpoint ckpt-200 (") and "\n" not in line
    assert line.endswith("is unreadable: resuming from ckpt-100 instead, 100 steps earlier")
    if damage == "bit flipped":
        assert "does not match the checksum recorded when it was written" in line


def test_a_failed_restore_of_the_newest_leaves_nothing_of_it(tmp_path):
    """Real corruption after the reads: the newest checkpoint's files are sound but its loop
    state is not JSON, so weights, slots and iterator were restored from it before it failed;
    the fallback replaces every one of them with the older checkpoint's."""
    ckpt, held = _train_between_saves(tmp_path, [100, 200])
    ckpt._state.assign("{not json")
    ckpt._manager.save(checkpoint_number=300)  # as a bug in the writer would leave it
    ckpt, model, state, lines = _resume(tmp_path)
    assert state["at"] == 200 and ckpt.restored.endswith("ckpt-200")
    _holds(ckpt, model, held[200])
    assert len(lines) == 1 and "ckpt-300 (" in lines[0] and "100 steps earlier" in lines[0]


def test_saves_after_a_fallback_replace_the_damaged_one_and_rotate(tmp_path):
    """Real file corruption (the newest truncated); after resuming from the one before, a save
    with the damaged one's number replaces it and the next save rotates out the oldest."""
    _, held = _train_between_saves(tmp_path, [100, 200])
    directory = tmp_path / "checkpoints"
    _truncate(_data_file(directory / "ckpt-200"))
    ckpt, _, _, _ = _resume(tmp_path)
    assert [os.path.basename(p) for p in ckpt._manager.checkpoints] == ["ckpt-100"]
    ckpt.save(dict(STATE, at="again"), 200)
    assert [os.path.basename(p) for p in ckpt._manager.checkpoints] == ["ckpt-100", "ckpt-200"]
    again, _, state, lines = _resume(tmp_path)
    assert state["at"] == "again" and lines == []
    ckpt.save(dict(STATE, at=300), 300)
    assert sorted(os.listdir(directory)) == sorted(
        ["checkpoint", "ckpt-200.index", "ckpt-200.data-00000-of-00001", "ckpt-200.sums.json",
         "ckpt-300.index", "ckpt-300.data-00000-of-00001", "ckpt-300.sums.json"])
    assert _resume(tmp_path)[2]["at"] == 300


def test_every_checkpoint_unreadable_is_refused_in_one_line(tmp_path):
    """Real file corruption: both kept checkpoints' data files truncated."""
    from elastictrainer.errors import UserError

    _train_between_saves(tmp_path, [100, 200])
    for step in (100, 200):
        _truncate(_data_file(tmp_path / "checkpoints" / f"ckpt-{step}"))
    with pytest.raises(UserError) as e:
        _resume(tmp_path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"cannot resume from {tmp_path / 'checkpoints' / 'ckpt-200'}: "
                              f"the checkpoint is unreadable (")
    assert message.endswith("), nor can the 1 before it; start the run over with --resume false")


def test_a_missing_data_file_falls_back(tmp_path):
    """Real file damage: the newest checkpoint's data file deleted (its sums file names it)."""
    _, held = _train_between_saves(tmp_path, [100, 200])
    os.remove(_data_file(tmp_path / "checkpoints" / "ckpt-200"))
    ckpt, model, state, lines = _resume(tmp_path)
    assert state["at"] == 100
    assert "ckpt-200 (ckpt-200.data-00000-of-00001 is missing)" in lines[0]


def test_a_checkpoint_written_without_checksums_is_still_read(tmp_path):
    """Real files as older code left them: the sums files deleted."""
    _, held = _train_between_saves(tmp_path, [100, 200])
    for name in os.listdir(tmp_path / "checkpoints"):
        if name.endswith(".sums.json"):
            os.remove(tmp_path / "checkpoints" / name)
    ckpt, model, state, lines = _resume(tmp_path)
    assert state["at"] == 200 and lines == []
    _holds(ckpt, model, held[200])


def test_a_kill_between_the_data_files_and_the_index_resumes_from_the_index(tmp_path):
    """Real files of a save cut short: a higher-numbered checkpoint's files written (one of
    them truncated) but not yet named by the index."""
    ckpt, held = _train_between_saves(tmp_path, [100, 200])
    half = ckpt._ckpt.write(str(tmp_path / "checkpoints" / "ckpt-300"))
    _truncate(_data_file(half))
    ckpt, model, state, lines = _resume(tmp_path)
    assert state["at"] == 200 and lines == [] and ckpt.restored.endswith("ckpt-200")
    _holds(ckpt, model, held[200])


def test_a_save_that_fails_midway_removes_its_files(tmp_path, monkeypatch):
    """Injected error: the manager writes the checkpoint's files, then raises before its index
    names them.  The files of that number go; the checkpoints the index names stay."""
    import tensorflow as tf

    ckpt, held = _train_between_saves(tmp_path, [100, 200])
    directory = tmp_path / "checkpoints"
    before = sorted(os.listdir(directory))

    def write_then_fail(self, checkpoint_number=None, **kwargs):
        self._checkpoint.write(str(directory / f"ckpt-{checkpoint_number}"))
        os.makedirs(directory / f"ckpt-{checkpoint_number}_temp", exist_ok=True)
        raise OSError("no space left on device")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", write_then_fail)
    with pytest.raises(OSError, match="no space"):
        ckpt.save(STATE, 300)
    assert sorted(os.listdir(directory)) == before
    assert _resume(tmp_path)[2]["at"] == 200
    # a number the index names keeps its files, overwritten here: they no longer match the
    # sums recorded when they were first written, so a resume skips them
    with pytest.raises(OSError, match="no space"):
        ckpt.save(STATE, 200)
    assert sorted(os.listdir(directory)) == before
    monkeypatch.undo()
    _, _, state, lines = _resume(tmp_path)
    assert state["at"] == 100 and "ckpt-200 (ckpt-200.data-00000-of-00001 " in lines[0]


def test_keep_checkpoints_keeps_that_many_with_their_sums(tmp_path):
    """No fault: max_to_keep 3 (--keep_checkpoints 3) keeps the newest three checkpoints and
    only their sums files."""
    _train_between_saves(tmp_path, [100, 200, 300, 400], max_to_keep=3)
    names = os.listdir(tmp_path / "checkpoints")
    assert sorted(n for n in names if n.endswith(".sums.json")) == [
        "ckpt-200.sums.json", "ckpt-300.sums.json", "ckpt-400.sums.json"]
    assert sorted(n for n in names if n.endswith(".index")) == [
        "ckpt-200.index", "ckpt-300.index", "ckpt-400.index"]
