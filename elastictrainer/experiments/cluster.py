"""A figure's runs as Ray tasks on a cluster of devices: `elastictrainer figure FIG --ray ADDRESS`.

Reproducing a figure takes hundreds of device-hours; a lab with several boards spreads its runs
over all of them.  Ray does the cluster work: it schedules tasks on the nodes, ties them to kinds
of device through custom resources, retries them, and ships aarch64 wheels for the boards.  This
module adds only what a figure needs on top (figures.Driver keeps the plan, the commands, the
resume rule and the plots):

- Each profiling and each training run is one Ray task that runs the serial driver's own
  `elastictrainer profile|train` command on its node, with the Python that node's Ray runs.
  Profiling comes first, once per model and head size for the kind of device the runs are
  pinned to; training runs are submitted together once the tables exist.
- `--ray_resources pi4=1`: every task asks for that much of the custom resource besides one CPU.
  A board started with `ray start --resources '{"pi4": 1}'` then takes the figure's runs one at
  a time, so that a run has its board to itself and its times are the board's.
- No shared filesystem: a task works in a folder of its node and returns its run directory's (or
  timing table's) files; the driver writes them under --logdir (--profiles), a run directory
  replaced whole, never half-written.  The timing table travels to the nodes with each run.
- A run that does not finish keeps its working folder on its node
  ($XDG_CACHE_HOME/elastictrainer/cluster, default ~/.cache/...): a retry or the next sweep
  that lands on that node continues it from its last checkpoint, as the serial driver's rerun
  does; one that finished there after its driver had gone is sent, not run again.  The folder
  is removed once the driver has written the run's files.
- Ray's retries: a run whose command fails, or whose node or worker is lost, runs once more
  (possibly elsewhere); after the second failure it is reported by name at the end, and the
  other runs go on.  Ctrl-C cancels the tasks; a running one passes the interrupt on to its
  run, which saves a checkpoint on its node.

Ray is an optional dependency (`pip install .[cluster]`): nothing here imports it until a
figure is run with --ray.
"""
import hashlib
import logging
import os
import shlex
import shutil
import socket

from elastictrainer import runlog
from elastictrainer.experiments.cluster_node import (RunFailed, Task, execute, read_tree, remove_kept,
                                         write_files)
from elastictrainer.errors import RunError, UserError, one_line
from elastictrainer.experiments.figures import table_path
from elastictrainer.profiler.table import default_trace_dir

INSTALL_HINT = "pip install 'elastictrainer[cluster]' (or pip install -e '.[cluster]' in a clone)"
# Ray's resources that are not a kind of device: left out when the nodes are listed
_BOOKKEEPING = ("memory", "object_store_memory", "node:", "accelerator_type:")


def resources_text(resources):
    return ",".join(f"{k}={v:g}" for k, v in resources.items())


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def check_reachable(address, timeout=5.0):
    """UserError unless something listens at HOST:PORT.  Ray itself keeps retrying an unreachable
    address for minutes before it gives up; a figure should say at once that the address is
    wrong."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise UserError(f"--ray {address}: expected HOST:PORT of a Ray cluster's head (as "
                        f"`ray start --head` prints it), 'auto', or 'local'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, socket.timeout) else (e.strerror or one_line(e))
        raise UserError(f"--ray {address}: cannot reach a Ray cluster there ({reason}); start "
                        f"one with `ray start --head` or pass --ray local") from None


# ------------------------------------------------------------------------------ on a node
def install_run_dir(files, prefix, dest):
    """Write the files under `prefix` (a run directory's) as the directory `dest`, replacing an
    older copy whole: a run directory is never half-written, so that its summary.json saying
    finished means its files are all there."""
    parent, name = os.path.split(dest)
    incoming, replaced = (os.path.join(parent, f".{name}.{what}") for what in ("incoming", "old"))
    for stale in (incoming, replaced):
        shutil.rmtree(stale, ignore_errors=True)
    write_files({os.path.relpath(rel, prefix): data for rel, data in files.items()}, incoming)
    if os.path.exists(dest):
        os.replace(dest, replaced)
    os.replace(incoming, dest)
    shutil.rmtree(replaced, ignore_errors=True)


def install_files(files, prefix, dest):
    """Write each file under `prefix` below `dest`, each one whole or not at all."""
    for rel, data in files.items():
        path = os.path.join(dest, os.path.relpath(rel, prefix))
        write_files({os.path.basename(path) + ".tmp": data}, os.path.dirname(path))
        os.replace(path + ".tmp", path)


def keep_name(run_dir):
    """The folder a node keeps an unfinished run in: the run's name, and a digest of where its
    driver keeps it (two sweeps of the same figure from two places do not mix)."""
    key = hashlib.sha1(f"{socket.gethostname()}:{run_dir}".encode()).hexdigest()[:16]
    return f"{os.path.basename(run_dir)}-{key}"


# seconds a wait for Ray tasks blocks before Python looks at its signals again
WAIT_S = 1.0


class RayRunner:
    """Runs a figures.Driver's commands as Ray tasks on the cluster at `address` ('local': a Ray
    instance started here, on this machine's cores), pinned to nodes that advertise
    `resources` ({name: amount})."""

    def __init__(self, address, resources=None, retries=1, progress=None):
        self.address = address
        self.resources = dict(resources or {})
        self.retries = retries
        self.progress = progress  # None: a progress bar when stderr is a terminal
        # a timing table is a device's: the runs' kind of device names their tables' folder
        self.device_kind = "+".join(sorted(self.resources)) or None
        self.ray = None
        self.placements = {}  # task name -> id of the node it ended on
        self.pending = {}     # the submitted tasks not yet ended: {ObjectRef: key}
        self.failed_text = "failed twice" if retries == 1 else f"failed {retries + 1} times"

    # ---------------------------------------------------------------------------- cluster
    def start(self, driver):
        ray = import_ray()
        if self.address not in ("local", "auto"):
            check_reachable(self.address)
        kwargs = dict(log_to_driver=False, logging_level=logging.WARNING)
        if self.address == "local":
            kwargs["include_dashboard"] = False
        try:
            ray.init(address=self.address, **kwargs)
        except Exception as e:  # no cluster there, another version of Ray, a wrong token...
            raise UserError(f"--ray {self.address}: Ray could not connect: {one_line(e)}") \
                from None
        self.ray = ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        need = dict(self.resources, CPU=1.0)
        fit = [n for n in nodes if all(n["Resources"].get(k, 0) >= v for k, v in need.items())]
        if not fit:
            what = (f"--ray_resources {resources_text(self.resources)}: no node advertises it"
                    if self.resources else "no node has a CPU for the runs")
            self.stop()
            raise UserError(f"{what}; the cluster's nodes: {describe(nodes)}")
        driver.log(f"Ray cluster at {self.address}: {len(nodes)} node(s), runs go to {len(fit)} "
                   f"of them: {describe(fit)}")

    def stop(self):
        if self.ray is not None:
            self._cancel()
            self.ray.shutdown()
            self.ray = None

    def _cancel(self):
        """Interrupted (Ctrl-C, or an error here): the runs still going are asked to stop and
        save their checkpoints on their nodes; the queued ones never start.  A cancelled
        task's result is ready before its run has saved, so a run the cancel reaches after
        Ray goes away resumes from its last epoch's checkpoint instead."""
        if not self.pending:
            return
        refs, self.pending = list(self.pending), {}
        for ref in refs:
            self.ray.cancel(ref)
        try:
            while refs:
                _, refs = self.ray.wait(refs, num_returns=len(refs), timeout=WAIT_S)
        except KeyboardInterrupt:  # a second Ctrl-C: stop at once
            pass

    def _remote(self, name):
        return self.ray.remote(execute).options(
            name=name, num_cpus=1, resources=self.resources or None,
            max_retries=self.retries, retry_exceptions=[RunFailed])

    def _on_node(self, node_id, fn):
        """fn as a task on that node, beside whatever runs there (it asks for no resource)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.ray.remote(fn).options(
            num_cpus=0, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))

    def _run(self, driver, tasks, what):
        """Submit {key: Task}; yield (key, Result or the error message) as each ends."""
        from tqdm import tqdm

        ray = self.ray
        refs = self.pending = {self._remote(task.name).remote(task): key
                               for key, task in tasks.items()}
        bar = tqdm(total=len(refs), desc=what, unit="run",
                   disable=None if self.progress is None else not self.progress)
        try:
            while refs:
                # a bounded wait, so that a Ctrl-C is seen within a second: Python runs its
                # signal handlers only between calls, and a run may take hours
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=WAIT_S)
                if not ready:
                    continue
                ref = ready[0]
                key = refs.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # the last attempt's failure (Ray retried it)
                    cause = getattr(e, "cause", None) or e
                    result = one_line(cause if isinstance(cause, RunFailed) else e)
                with tqdm.external_write_mode():
                    yield key, result
                bar.update(1)
        finally:
            bar.close()
            self._cancel()

    def _report(self, driver, task, result):
        driver.log(f"$ elastictrainer {shlex.join(task.args)}   (on {result.node})")
        for line in result.output.rstrip().splitlines():
            driver.log(line)

    # ---------------------------------------------------------------------------- stages
    def profile(self, driver, jobs):
        tasks = {}
        for run, path in jobs:
            rel = os.path.join("profiles", os.path.basename(path))
            # the trace comes back inside "profiles" and goes beside the runs (figures.py)
            tasks[run, path] = Task(f"profile {run.model}",
                                    driver.profile_args(run, rel, "profiles"),
                                    output="profiles", python=driver.python)
        failed = []
        for (run, path), result in self._run(driver, tasks, "profiling"):
            if isinstance(result, str):
                failed.append(f"{run.model} ({result})")
                continue
            self._report(driver, tasks[run, path], result)
            self.placements[tasks[run, path].name] = result.node_id
            trace = default_trace_dir(os.path.splitext(os.path.basename(path))[0],
                                      "profiles") + os.sep
            install_files({k: v for k, v in result.files.items() if not k.startswith(trace)},
                          "profiles", os.path.dirname(path))
            install_files({k: v for k, v in result.files.items() if k.startswith(trace)},
                          "profiles", driver.logdir)
            driver.log(f"  profile {run.model}: done on {result.node} after "
                       f"{result.seconds:.0f} s")
        if failed:
            raise RunError(f"profiling {self.failed_text}: {'; '.join(failed)}")

    def train(self, driver, jobs):
        tasks = {}
        for run, seed in jobs:
            name = run.name(seed)
            table = table_path(run, driver.protocol_for(run.model), driver.profiles)
            with open(table, "rb") as f:
                inputs = {os.path.join("profiles", os.path.basename(table)): f.read()}
            run_dir = driver.run_dir(run, seed)
            if os.path.isdir(run_dir):  # unfinished (the driver sends no finished run): the
                # run continues from this copy's checkpoint
                inputs.update({os.path.join("logs", rel): data for rel, data in
                               read_tree(run_dir, os.path.dirname(run_dir)).items()})
            tasks[run, seed] = Task(name, driver.train_args(run, seed, "logs", "profiles"),
                                    output=os.path.join("logs", name), inputs=inputs,
                                    keep=keep_name(run_dir), python=driver.python)
        cleanups = []
        for (run, seed), result in self._run(driver, tasks, f"{driver.key} runs"):
            task = tasks[run, seed]
            if isinstance(result, str):
                driver.log(f"  {task.name}: {self.failed_text} ({result})")
                yield run, seed, f"{self.failed_text} ({result})"
                continue
            self._report(driver, task, result)
            self.placements[task.name] = result.node_id
            run_dir = driver.run_dir(run, seed)
            install_run_dir(result.files, task.output, run_dir)
            cleanups.append(self._on_node(result.node_id, remove_kept).remote(task.keep))
            status = runlog.read_summary(run_dir).get("status")
            driver.log(f"  {task.name}: {status} on {result.node} after {result.seconds:.0f} s")
            yield run, seed, "finished" if status == "finished" else f"ended {status}"
        self.ray.wait(cleanups, num_returns=len(cleanups))


def describe(nodes):
    """'192.0.2.2 [CPU 2, pi4 1]; ...': each node and what it advertises."""
    out = []
    for n in nodes:
        res = {k: v for k, v in n["Resources"].items() if not k.startswith(_BOOKKEEPING)}
        text = ", ".join(f"{k} {v:g}" for k, v in sorted(res.items()))
        out.append(f"{n.get('NodeManagerAddress', '?')} [{text or 'nothing'}]")
    return "; ".join(out) or "none"
