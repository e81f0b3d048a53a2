"""What a Ray task of `elastictrainer figure --ray` does on its node (cluster.py is the
driver's side): run one `elastictrainer profile|train` command in a working folder of the node,
seeded with the files it needs, and return the files it made.  A run that does not finish keeps
its folder (cache_root) for a retry or the next sweep on that node to continue from its
checkpoint.  No Ray import here: Ray calls `execute` on the node."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from elastictrainer import runlog

LOG_NAME = "elastictrainer-output.log"  # the command's output, beside (not in) what comes back


@dataclass
class Task:
    """One command for a node: `elastictrainer ARGS` in a working folder seeded with `inputs`
    (relative path -> bytes); the files under `output` come back."""
    name: str
    args: list
    output: str
    inputs: dict = field(default_factory=dict)
    keep: str = None        # a folder name kept on the node until the run finishes (resume)
    python: str = None      # None: the Python this node's Ray runs


@dataclass
class Result:
    files: dict             # relative path -> bytes, under the task's output
    output: str             # what the command printed
    node: str               # the node's address
    node_id: str
    seconds: float


class RunFailed(Exception):
    """A task's command exited non-zero (Ray retries it once)."""


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "elastictrainer", "cluster")


def read_tree(folder, relative_to):
    files = {}
    for base, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, relative_to)] = f.read()
    return files


def write_files(files, root):
    for rel, data in files.items():
        path = os.path.normpath(os.path.join(root, rel))
        if os.path.isabs(rel) or not path.startswith(os.path.normpath(root) + os.sep):
            raise ValueError(f"refusing to write {rel!r} outside {root}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _spawn(argv, **kwargs):
    """subprocess.Popen, with SIGINT deliverable in the child.  A Ray worker blocks SIGINT, and
    a child inherits its parent's signal mask: a run started as is would never see the SIGINT
    by which a cancelled task asks it to save and stop."""
    previous = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait(proc):
    # Ray cancels a task by raising KeyboardInterrupt in it, which a blocking wait() only sees
    # once the child ends: waiting in short slices lets a cancel through at once.
    while True:
        try:
            return proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass


def execute(task):
    """Runs on a node (the body of every Ray task): the command in its working folder, then the
    files it wrote under task.output, or RunFailed with the end of its output."""
    import ray

    t0 = time.perf_counter()
    if task.keep:
        work = os.path.join(cache_root(), task.keep)
        if any(rel.startswith(task.output + os.sep) for rel in task.inputs):
            # the driver's copy of the run is the one to continue
            shutil.rmtree(os.path.join(work, task.output), ignore_errors=True)
        os.makedirs(work, exist_ok=True)
    else:
        work = tempfile.mkdtemp(prefix="elastictrainer-")
    try:
        write_files(task.inputs, work)
        if task.keep and runlog.finished_summary(os.path.join(work, task.output)) is not None:
            # it finished here, but its files never reached the driver (a sweep stopped just
            # then): they are sent now, and the run is not run again
            return _result(work, task, "finished before on this node; not run again\n", t0)
        argv = [task.python or sys.executable, "-m", "elastictrainer"] + list(task.args)
        # Ray caps OMP_NUM_THREADS at the CPUs it assigned the task, to keep many small tasks
        # from oversubscribing a node; a run has its board to itself, as in the serial driver
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        log_path = os.path.join(work, LOG_NAME)
        with open(log_path, "w") as log:
            proc = _spawn(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                rc = _wait(proc)
            except KeyboardInterrupt:
                # cancelled: the run finishes its step and saves a checkpoint here
                proc.send_signal(signal.SIGINT)
                _wait(proc)
                raise
        with open(log_path, errors="replace") as f:
            output = f.read()
        if rc != 0:
            tail = [line for line in output.splitlines() if line.strip()][-1:] or [""]
            raise RunFailed(f"exit {rc} on {ray.util.get_node_ip_address()}: {tail[0][:300]}")
        return _result(work, task, output, t0)
    except BaseException:
        if not task.keep:
            shutil.rmtree(work, ignore_errors=True)
        raise


def remove_kept(keep):
    """Runs on the node that kept a run's working folder, once the driver holds the run."""
    shutil.rmtree(os.path.join(cache_root(), keep), ignore_errors=True)


def _result(work, task, output, t0):
    """The task's Result.  A temporary working folder is removed; a run's stays until its driver
    has written the files (remove_kept), since a Result whose driver has gone is lost."""
    import ray

    files = read_tree(os.path.join(work, task.output), work)
    if not task.keep:
        shutil.rmtree(work, ignore_errors=True)
    return Result(files, output, ray.util.get_node_ip_address(),
                  ray.get_runtime_context().get_node_id(), time.perf_counter() - t0)


# ------------------------------------------------------------------------------ the driver
