"""Resuming a run after a crash, a reboot or an out-of-memory kill (not in the paper; its
figures take hours to days on a Jetson or a Pi).

One tf.train.Checkpoint per save holds everything a run needs to go on as if it had never
stopped: the model's weights, the optimizer's state (slots, iteration count, hence the schedule
position), the input pipelines' iterators (data order and probe batches continue where they
were) and the loop's own state as one JSON string (epoch and step, the selection, the closed
loop's time-model corrections, the summary so far, the augmentation generators' states), with
the version of its layout (CHECKPOINT_VERSION; migrate_state reads older ones).
tf.train.CheckpointManager writes each checkpoint's files before it rewrites its index file
atomically, so a `kill -9` at any moment leaves the previous checkpoint readable; the last few
are kept (--keep_checkpoints).  Each saved checkpoint is made durable and its files' checksums
recorded (checkpoint_files.py), and a resume reads the newest checkpoint that is intact: one
that is damaged (a power cut, a full disk, a bad sector) costs the steps since the one before,
not the run.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import json
import os

import tensorflow as tf
from google.protobuf import text_format

from elastictrainer import runlog
from elastictrainer.errors import UserError, one_line
from elastictrainer.runs import checkpoint_files

CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_NAME = "ckpt"  # checkpoint N is <run>/checkpoints/ckpt-N, N the global step
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
    """Checkpoints of one run directory (`run_dir/checkpoints`), the latest `max_to_keep`
    kept."""

    def __init__(self, run_dir, model, optimizer, iterators, max_to_keep=2, write_dir=None,
                 log=print):
        """write_dir: where this process saves, when not the run's own directory (a
        multi-worker run's other workers: they save as tf.distribute requires, into a directory
        removed after each save, and restore the chief's checkpoints).  log: where restore says
        that it skipped a damaged checkpoint."""
        self.run_dir = run_dir
        self.directory = os.path.join(run_dir, CHECKPOINT_DIR)
        self.write_dir = write_dir
        self.max_to_keep = max_to_keep
        self.log = log
        self.restored = None  # the checkpoint restore() read
        self._state = tf.Variable("", dtype=tf.string, trainable=False)
        self._ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, loop_state=self._state,
                                         **iterators)
        self._manager = self._new_manager()

    def _new_manager(self):
        return tf.train.CheckpointManager(self._ckpt, self.write_dir or self.directory,
                                          max_to_keep=self.max_to_keep,
                                          checkpoint_name=CHECKPOINT_NAME)

    @property
    def latest(self):
        """The newest checkpoint the index names (restore() may have read an older one)."""
        return tf.train.latest_checkpoint(self.directory)

    @property
    def steps(self):
        """The global steps of the checkpoints kept (each is saved as ckpt-<step>)."""
        return [int(path.rsplit("-", 1)[1]) for path in self._manager.checkpoints]

    def save(self, state, step):
        """Save the model, optimizer and iterators with the loop's `state` (a JSON-able dict),
        which is stored with its version: {"version": CHECKPOINT_VERSION, **state}.  Once this
        returns, the checkpoint is on the disk with its checksums; a save that fails leaves no
        files of its own that the index does not name."""
        versioned = {"version": CHECKPOINT_VERSION, **state}
        versioned["version"] = CHECKPOINT_VERSION  # the format written is always this code's
        self._state.assign(json.dumps(versioned))
        directory = self.write_dir or self.directory
        try:
            path = self._manager.save(checkpoint_number=step)
        except BaseException:
            # A number the index names keeps its files and its older sums: if this save
            # overwrote them in part, they no longer match, and a resume skips them.
            prefix = os.path.join(directory, f"{CHECKPOINT_NAME}-{step}")
            try:
                if _norm(prefix) in {_norm(p) for p in self._indexed(directory)}:
                    checkpoint_files.remove_temp(prefix)
                else:
                    checkpoint_files.remove(prefix)
            except Exception:  # the save's own error says more than the cleanup's
                pass
            raise
        if self.write_dir:
            tf.io.gfile.rmtree(self.write_dir)
            return path
        checkpoint_files.seal(path)
        checkpoint_files.remove_stale_sums(directory, self._manager.checkpoints)
        return path

    @staticmethod
    def _indexed(directory):
        """The checkpoints the index of `directory` names, newest first."""
        state = tf.train.get_checkpoint_state(directory)
        if state is None:
            return []
        paths = list(state.all_model_checkpoint_paths)
        latest = state.model_checkpoint_path
        if latest in paths:
            paths.remove(latest)
        return [latest] + paths[::-1] if latest else paths[::-1]

    def _read(self, path):
        """Restore checkpoint `path` in place and return its loop state; any exception: it is
        unreadable."""
        damage = checkpoint_files.damage(path)
        if damage:
            raise ValueError(damage)
        self._ckpt.restore(path).assert_existing_objects_matched()
        state = json.loads(self._state.numpy().decode())
        if not isinstance(state, dict):
            raise ValueError("its loop state is not a JSON object")
        return state

    def restore(self):
        """The loop state of the newest checkpoint that can be read, migrated to
        CHECKPOINT_VERSION (its "version" included), everything else restored in place from
        that same checkpoint (`restored` names it).  Damaged newer ones are skipped, said in one
        line, and dropped from the index, so that the saves that follow number and rotate as if
        they had never been written.  One line (UserError) when none can be read or the one
        read is of a newer version than this code reads."""
        candidates = self._indexed(self.directory)
        skipped = []
        for path in candidates:
            try:
                state = self._read(path)
                break
            except Exception as e:  # a damaged file fails in TF's reader with any of several types
                message = e.message if isinstance(e, tf.errors.OpError) else str(e)
                skipped.append((path, one_line(message, 160)))
        else:
            if not skipped:
                raise UserError(f"cannot resume {self.run_dir}: its checkpoint index names no "
                                f"checkpoint; start the run over with --resume false")
            path, why = skipped[0]
            others = "" if len(skipped) == 1 else (
                f", nor can the {len(skipped) - 1} before it")
            raise UserError(f"cannot resume from {path}: the checkpoint is unreadable "
                            f"({why}){others}; start the run over with --resume false")
        self._check_version(state, path)
        if skipped:
            # Every variable, slot and iterator of the damaged checkpoints is in this one too
            # (the same run), so reading it overwrote whatever their failed reads had set.
            self._forget(skipped, path)
        self.restored = path
        return migrate_state(state)

    def _forget(self, skipped, restored):
        """Say which damaged checkpoints were skipped for `restored`, and (the chief) drop them
        from the index and from the manager's rotation."""
        names = ", ".join(f"{os.path.basename(p)} ({why})" for p, why in skipped)
        lost = _number(skipped[0][0]) - _number(restored)
        self.log(f"warning: checkpoint{'s' if len(skipped) > 1 else ''} {names} "
                 f"{'are' if len(skipped) > 1 else 'is'} unreadable: resuming from "
                 f"{os.path.basename(restored)} instead, {lost} steps earlier")
        if self.write_dir:
            return  # the chief rewrites the index
        state = tf.train.get_checkpoint_state(self.directory)
        dropped = {_norm(p) for p, _ in skipped}
        paths = list(state.all_model_checkpoint_paths)
        stamps = list(state.all_model_checkpoint_timestamps)
        keep = [k for k, p in enumerate(paths) if _norm(p) not in dropped]
        # names relative to the directory, as the manager writes them, so that the run
        # directory can still be moved
        state.model_checkpoint_path = os.path.basename(restored)
        del state.all_model_checkpoint_paths[:]
        state.all_model_checkpoint_paths.extend(os.path.basename(paths[k]) for k in keep)
        del state.all_model_checkpoint_timestamps[:]
        if len(stamps) == len(paths):
            state.all_model_checkpoint_timestamps.extend(stamps[k] for k in keep)
        runlog.write_text(os.path.join(self.directory, checkpoint_files.INDEX_FILE),
                          text_format.MessageToString(state))
        self._manager = self._new_manager()

    def _check_version(self, state, path):
        version = state.get("version")  # none: saved before the version was recorded
        if version is None:
            return
        if not (isinstance(version, int) and not isinstance(version, bool) and version >= 1):
            raise UserError(f"cannot resume from {path}: the checkpoint's state version "
                            f"{version!r} is not a positive integer; start the run over "
                            f"with --resume false")
        if version > CHECKPOINT_VERSION:
            raise UserError(f"cannot resume {self.run_dir}: its checkpoint has state "
                            f"version {version}, newer than this ElasticTrainer reads "
                            f"({CHECKPOINT_VERSION}); upgrade, or start over with "
                            f"--resume false")


def _norm(path):
    return os.path.normpath(os.path.abspath(path))


def _number(path):
    """N of a checkpoint `.../ckpt-N` (the global step it was saved at)."""
    return int(path.rsplit("-", 1)[1])


def check_same_run(saved, cfg, run_dir):
    """Refuse to resume a run directory made with other settings, naming the first that
    differs (a setting its config.json predates counts as that setting's default)."""
    differs = cfg.first_difference(saved, IDENTITY)
    if differs:
        key, old, new = differs
        raise UserError(f"{run_dir} holds a run with --{key} {old}, not {new}: pass another "
                        f"--run_name, or --resume false to start that run over")
