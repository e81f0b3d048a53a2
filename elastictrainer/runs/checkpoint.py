"""Resuming a run after a crash, a reboot or an out-of-memory kill (not in the paper; its
figures take hours to days on a Jetson or a Pi).

One tf.train.Checkpoint per save holds everything a run needs to go on as if it had never
stopped: the model's weights, the optimizer's state (slots, iteration count, hence the schedule
position), the input pipelines' iterators (data order and probe batches continue where they
were) and the loop's own state as one JSON string (epoch and step, the selection, the closed
loop's time-model corrections, the summary so far, the augmentation generators' states), with
the version of its layout (CHECKPOINT_VERSION; migrate_state reads older ones).
tf.train.CheckpointManager writes each checkpoint's files before it rewrites its index file
atomically, so a `kill -9` at any moment leaves the previous checkpoint readable.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import json
import os

import tensorflow as tf

from elastictrainer.errors import UserError, one_line

CHECKPOINT_DIR = "checkpoints"
# The version of the loop state a checkpoint holds.  Raise it when the state changes so that
# code reading the old layout would misread the new one, and add the step from the old version
# to migrate_state: runs checkpointed before the change still resume, and an older
# ElasticTrainer refuses the new checkpoints instead of misreading them.
CHECKPOINT_VERSION = 1
# Settings that make a run what it is: a checkpoint of a run with other values is refused.
IDENTITY = ("model_name", "dataset_name", "train_type", "rho", "batch_size", "input_size",
            "num_classes", "optimizer", "learning_rate", "weight_decay", "num_epochs",
            "interval", "seed", "weights", "probe_batches", "steps_per_epoch", "rho_feedback",
            "lr_schedule", "bn_mode")


def migrate_state(state):
    """A loop state saved by a checkpoint of CHECKPOINT_VERSION or older (or without a version:
    written before versions were recorded), as a state of CHECKPOINT_VERSION: a new dict.

    This is where a later change to the state (what runs/loop.py saves at a checkpoint) adds its
    migration: the step from the version before to the new one, after the steps before it, so
    that a run checkpointed by an older ElasticTrainer resumes.  Version 1 is the state as it
    was first saved, which checkpoints without a version hold too: for now nothing changes but
    the version."""
    return dict(state, version=CHECKPOINT_VERSION)


class RunCheckpoint:
    """Checkpoints of one run directory (`run_dir/checkpoints`), the latest two kept."""

    def __init__(self, run_dir, model, optimizer, iterators, max_to_keep=2, write_dir=None):
        """write_dir: where this process saves, when not the run's own directory (a
        multi-worker run's other workers: they save as tf.distribute requires, into a directory
        removed after each save, and restore the chief's checkpoints)."""
        self.run_dir = run_dir
        self.directory = os.path.join(run_dir, CHECKPOINT_DIR)
        self.write_dir = write_dir
        self._state = tf.Variable("", dtype=tf.string, trainable=False)
        self._ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, loop_state=self._state,
                                         **iterators)
        self._manager = tf.train.CheckpointManager(
            self._ckpt, write_dir or self.directory, max_to_keep=max_to_keep)

    @property
    def latest(self):
        return tf.train.latest_checkpoint(self.directory)

    @property
    def steps(self):
        """The global steps of the checkpoints kept (each is saved as ckpt-<step>)."""
        return [int(path.rsplit("-", 1)[1]) for path in self._manager.checkpoints]

    def save(self, state, step):
        """Save the model, optimizer and iterators with the loop's `state` (a JSON-able dict),
        which is stored with its version: {"version": CHECKPOINT_VERSION, **state}."""
        versioned = {"version": CHECKPOINT_VERSION, **state}
        versioned["version"] = CHECKPOINT_VERSION  # the format written is always this code's
        self._state.assign(json.dumps(versioned))
        path = self._manager.save(checkpoint_number=step)
        if self.write_dir:
            tf.io.gfile.rmtree(self.write_dir)
        return path

    def restore(self):
        """The loop state of the latest checkpoint, migrated to CHECKPOINT_VERSION (its
        "version" included), everything else restored in place; one line (UserError) when it
        cannot be read or is of a newer version than this code reads."""
        path = self.latest
        try:
            self._ckpt.restore(path).assert_existing_objects_matched()
            state = json.loads(self._state.numpy().decode())
            if not isinstance(state, dict):
                raise ValueError("its loop state is not a JSON object")
        except Exception as e:  # a truncated file fails in TF's reader with any of several types
            message = e.message if isinstance(e, tf.errors.OpError) else str(e)
            raise UserError(f"cannot resume from {path}: the checkpoint is unreadable "
                            f"({one_line(message, 160)}); start the run over with --resume "
                            f"false") from None
        version = state.get("version")  # none: saved before the version was recorded
        if version is not None:
            if not (isinstance(version, int) and not isinstance(version, bool) and version >= 1):
                raise UserError(f"cannot resume from {path}: the checkpoint's state version "
                                f"{version!r} is not a positive integer; start the run over "
                                f"with --resume false")
            if version > CHECKPOINT_VERSION:
                raise UserError(f"cannot resume {self.run_dir}: its checkpoint has state "
                                f"version {version}, newer than this ElasticTrainer reads "
                                f"({CHECKPOINT_VERSION}); upgrade, or start over with "
                                f"--resume false")
        return migrate_state(state)


def check_same_run(saved, cfg, run_dir):
    """Refuse to resume a run directory made with other settings, naming the first that
    differs."""
    for key in IDENTITY:
        old, new = saved.get(key), getattr(cfg, key)
        if key == "num_classes" and new is None:
            continue
        if key == "bn_mode" and old is None:  # saved before the flag: BatchNorm as called
            old = "model"
        if old != new:
            raise UserError(f"{run_dir} holds a run with --{key} {old}, not {new}: pass another "
                            f"--run_name, or --resume false to start that run over")
