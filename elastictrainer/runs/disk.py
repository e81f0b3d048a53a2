"""A run and its disk: a full disk met while the run writes stops it cleanly (stops_cleanly),
and what a resume reads besides the checkpoint survives a truncated copy on the disk (the run's
settings kept in the checkpoint's loop state, the timing table kept in the run directory).

A full disk is the usual end of a long run on a Raspberry Pi or a Jetson's SD card.  Whichever
writer meets it (a checkpoint, TensorBoard's events, summary.json, the timing table), the run
stops with one line naming the disk and the last good checkpoint, leaves no temporary file
where a resume would look, and the same command resumes once space is freed.  The prefix
cache's disk store is not stopped here: it turns the cache off and the run goes on
(prefix/cache.py).  What a run will write is estimated before it starts (room.py).
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import contextlib
import errno
import json
import os
import shutil

import tensorflow as tf

from elastictrainer import runlog
from elastictrainer.errors import RunError, UserError, one_line
from elastictrainer.runs.checkpoint import CHECKPOINT_DIR

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# The run's copy of the timing table it was set up with: a resume reads it, not the shared one.
RUN_TABLE_FILE = "timing_table.json"
# Where the loop's checkpoint state keeps the run's settings (config.json's content).
CONFIG_KEY = "config"


def is_disk_full(exc):
    """Whether `exc`, or an exception it was raised from or during, is a full disk: Python's
    OSError ENOSPC (or a quota's EDQUOT), or TensorFlow's file ops, which raise
    ResourceExhaustedError for a checkpoint's or an event file's write with the system's
    message (other TensorFlow errors carry it too)."""
    return _full_error(exc) is not None


def mount_point(path):
    """The mount point of the file system `path` is on (the disk that is full)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def remove_partial_writes(out):
    """Remove what a write cut short leaves in run directory `out`: runlog's temporary files
    and a checkpoint's temporary directory (TensorFlow writes ckpt-N_temp, then renames it)."""
    if not os.path.isdir(out):
        return
    for name in os.listdir(out):
        if name.endswith(runlog.TMP_SUFFIX) or name == "tmp-" + runlog.BEST_WEIGHTS_FILE:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out, name))
    ckpts = os.path.join(out, CHECKPOINT_DIR)
    if os.path.isdir(ckpts):
        for name in os.listdir(ckpts):
            if name.endswith("_temp") or name.endswith(runlog.TMP_SUFFIX):
                path = os.path.join(ckpts, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(path)


def saved_state(out):
    """The loop state of run directory `out`'s latest checkpoint, read without restoring
    anything (None when there is none, or it is unreadable)."""
    directory = os.path.join(out, CHECKPOINT_DIR)
    try:
        latest = tf.train.latest_checkpoint(directory)
        if latest is None:
            return None
        reader = tf.train.load_checkpoint(latest)
        key = next(k for k in reader.get_variable_to_shape_map() if k.startswith("loop_state"))
        state = json.loads(reader.get_tensor(key))
    except (tf.errors.OpError, StopIteration, ValueError, OSError):
        return None
    return state if isinstance(state, dict) else None


def saved_config(out):
    """The run's settings as its latest checkpoint keeps them (None: not kept there)."""
    state = saved_state(out)
    config = state.get(CONFIG_KEY) if state else None
    return config if isinstance(config, dict) else None


def restore_config(out, log):
    """config.json from the checkpoint's copy when the file is missing or unreadable (a write
    cut short by a full disk or a power cut); the settings, or None when none is kept."""
    config = saved_config(out)
    if config is None:
        return None
    log(f"warning: {os.path.join(out, runlog.CONFIG_FILE)} is unreadable; the run's settings "
        f"are read from its checkpoint and the file is written again")
    runlog.write_json(os.path.join(out, runlog.CONFIG_FILE), config)
    return config


def table_to_read(shared, out, cfg, log):
    """The timing table path a run reads: a resumed run's own copy (RUN_TABLE_FILE, written when
    it started), so that a shared table profiled again or cut short since does not change its
    results; else the shared `shared` path, removed first when it is not whole JSON (a write
    cut short), so that it is profiled again."""
    copy = os.path.join(out, RUN_TABLE_FILE)
    if cfg.resume and os.path.exists(os.path.join(out, CHECKPOINT_DIR, "checkpoint")):
        if _whole_json(copy):
            return copy
    if os.path.exists(shared) and not _whole_json(shared):
        log(f"warning: the timing table {shared} is cut short or not JSON; profiling it again")
        os.remove(shared)
    return shared


def keep_table(table, out):
    """The run's copy of the timing table it reads (table_to_read)."""
    os.makedirs(out, exist_ok=True)
    runlog.write_json(os.path.join(out, RUN_TABLE_FILE), table)


def _whole_json(path):
    try:
        with open(path) as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def last_good(out):
    """How the line names the checkpoint a resume starts from (None: there is none)."""
    state = saved_state(out)
    latest = tf.train.latest_checkpoint(os.path.join(out, CHECKPOINT_DIR))
    if latest is None or state is None:
        return None
    loop = state.get("loop", {})
    return (f"the last good checkpoint is {latest} (it resumes at epoch "
            f"{loop.get('epoch', 0) + 1}, step {loop.get('step_in_epoch', 0)})")


def _mark_failed(out, line):
    """summary.json says the run failed and why, if it can still be written."""
    try:
        summary = runlog.read_summary(out)
        if summary.get("status") in ("running", "failed"):
            summary.update(status="failed", error=line)
            runlog.write_json(os.path.join(out, runlog.SUMMARY_FILE), summary)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def stops_cleanly(out, started=True, chief=True):
    """A full disk met inside stops the run of directory `out` in one line (RunError, exit 1):
    the disk, the last good checkpoint, and free space and run the same command to resume;
    temporary files are removed and summary.json says failed where it can be written.
    started false: the run's setup (profiling, the run directory), before any checkpoint;
    chief false: a multi-worker run's other worker, which leaves summary.json to the chief."""
    try:
        yield
    except Exception as e:
        full = _full_error(e)
        if isinstance(e, UserError) or full is None:
            raise
        remove_partial_writes(out)
        disk = mount_point(getattr(full, "filename", None) or out)
        free_mb = shutil.disk_usage(disk).free / 2**20
        good = last_good(out) if started else None
        where = (f"while setting the run up: free space and run the same command" if not started
                 else f"while writing {out}: no checkpoint was saved yet; free space and run the "
                 f"same command to start it again" if good is None
                 else f"while writing {out}: {good}; free space and run the same command to "
                 f"resume")
        line = f"no space left on device on {disk} ({free_mb:.1f} MB free) {where}"
        if started and chief:
            _mark_failed(out, line)
        raise RunError(one_line(line, 600)) from e


def _full_error(exc):
    """The exception of `exc`'s chain that says the disk is full (is_disk_full), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return exc
        if isinstance(exc, tf.errors.OpError) and any(
                os.strerror(n) in str(exc.message) for n in _FULL_ERRNOS):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
