"""Resuming in this process: the run's checkpoint round-trips its loop state with the state's
version (an unversioned one restores as the current version, a newer one is refused in one
line), a run checkpointed without that version resumes, and the TensorBoard events written
after a checkpoint are dropped."""
import json
import os
import signal

import pytest

from elastictrainer import runlog


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
    from elastictrainer.flavors import optimizers
    from elastictrainer.runs.checkpoint import RunCheckpoint

    tf.keras.utils.set_random_seed(seed)
    model = tiny_model()
    optimizer = optimizers.make_optimizer("sgd", 0.01, 5e-4, total_steps=10)
    optimizers.prepare_optimizer(optimizer, model.trainable_weights)
    data = iter(tf.data.Dataset.range(100))
    return RunCheckpoint(str(run_dir), model, optimizer, {"train_data": data}), model


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
