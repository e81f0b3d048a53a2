"""Beyond one device: ElasticTrainer on tf.distribute (--strategy).

- one_device: no strategy, the loop as it is on one device.
- mirrored: tf.distribute.MirroredStrategy over the local GPUs, or over --logical_cpus N
  logical devices the CPU is split into (to try it, and to test it, without GPUs).
- multi_worker: tf.distribute.MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG or,
  without it, from SLURM's environment (TensorFlow's own resolvers).

What ElasticTrainer adds here: a selection's step computes no frozen tensor's gradient, so it
all-reduces none either; the probe and timed full steps compute and all-reduce every gradient.
A step runs the forward and backward pass of the selected tensors on every replica
(`strategy.run`), all-reduces exactly those gradients (the bytes are recorded as the step is
traced, `allreduce_bytes`; collectives.py reads them from the graph to check), and applies the
optimizer's update to every replica's copy of
each variable in cross-replica context (`strategy.extended.update` with the Keras flavor's
update_variable), as Keras does inside its merge_call, without the merge_call.  The loss is the
global batch's mean: each replica's sum of per-example losses over the global batch size.

The elastic runtime runs once: in the one process of a mirrored run, and on the chief of a
multi-worker run, which broadcasts each step's kind and selection to the other workers before the
step (`Decisions`): all workers train the same tensors at the same step, and a worker at another
step than the chief stops the run.  Importance comes from all-reduced gradients, the whole
global batch's.  The chief writes summaries, events and checkpoints; every worker restores.
"""
import json
import os

from elastictrainer.machine import DEFER_DEVICES_ENV, LOGICAL_CPUS_ENV
from elastictrainer.errors import UserError

STRATEGIES = {
    "one_device": "no tf.distribute: the model on one device",
    "mirrored": "MirroredStrategy over the local GPUs, or over --logical_cpus N parts of the CPU",
    "multi_worker": "MultiWorkerMirroredStrategy; the cluster from TF_CONFIG, else from SLURM",
}
# step kinds the chief broadcasts (elastic/runtime.py's names)


# ----------------------------------------------------------------------------- the cluster
def parse_tf_config(text):
    """TF_CONFIG as TensorFlow documents it, checked: {"cluster": {"worker": [host:port, ...],
    "chief": [...]?}, "task": {"type": ..., "index": ...}}.  Returns (cluster, task); a
    malformed one is a one-line UserError saying what is wrong."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise UserError(f"TF_CONFIG is not JSON ({e}); it should look like "
                        f'{{"cluster": {{"worker": ["host1:port", "host2:port"]}}, '
                        f'"task": {{"type": "worker", "index": 0}}}}') from None
    if not isinstance(config, dict):
        raise UserError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise UserError("TF_CONFIG has no 'cluster' (a map of job name to host:port lists)")
    for job, hosts in cluster.items():
        if (not isinstance(hosts, list) or not hosts
                or not all(isinstance(h, str) and ":" in h for h in hosts)):
            raise UserError(f"TF_CONFIG's cluster job {job!r} must be a list of 'host:port' "
                            f"strings, got {hosts!r}")
    if "worker" not in cluster and "chief" not in cluster:
        raise UserError("TF_CONFIG's cluster names no 'worker' (or 'chief') job")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UserError("TF_CONFIG has no 'task' with 'type' and 'index' (which member of the "
                        "cluster this process is)")
    kind, index = task["type"], task["index"]
    if kind not in cluster:
        raise UserError(f"TF_CONFIG's task type {kind!r} is not a job of its cluster "
                        f"({', '.join(cluster)})")
    if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise UserError(f"TF_CONFIG's task index {index!r} is outside its {kind} job "
                        f"(0 to {len(cluster[kind]) - 1})")
    return cluster, task


def local_cluster(workers):
    """TF_CONFIG values of a cluster of `workers` processes on this machine, on free ports: to
    try multi_worker here (the tests and scripts/bench_distributed.py do)."""
    import socket

    ports = []
    for _ in range(workers):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(s.getsockname()[1])
    hosts = [f"localhost:{p}" for p in ports]
    return [json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}})
            for i in range(workers)]


def _cluster_resolver():
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    if text:
        parse_tf_config(text)
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if os.environ.get("SLURM_PROCID") is not None:
        return tf.distribute.cluster_resolver.SlurmClusterResolver()
    raise UserError("--strategy multi_worker needs the cluster: set TF_CONFIG on every worker "
                    "(docs/usage.md shows a two-machine example), or run under SLURM")


def check_flags(cfg):
    """What can be told from the settings alone (before TensorFlow starts)."""
    if cfg.strategy not in STRATEGIES:
        raise UserError(f"unknown --strategy {cfg.strategy!r}; valid: {', '.join(STRATEGIES)}")
    if cfg.logical_cpus is not None:
        if cfg.strategy != "mirrored":
            raise UserError("--logical_cpus splits the CPU for --strategy mirrored only")
        if cfg.logical_cpus < 2:
            raise UserError(f"--logical_cpus must be at least 2, got {cfg.logical_cpus}")
    if cfg.strategy == "multi_worker" and os.environ.get("TF_CONFIG"):
        parse_tf_config(os.environ["TF_CONFIG"])


def prepare_process(cfg):
    """What must happen before this process starts TensorFlow: --logical_cpus's split, and
    for multi_worker no device made before the strategy configures the collective ops."""
    if cfg.strategy == "mirrored" and cfg.logical_cpus:
        os.environ[LOGICAL_CPUS_ENV] = str(cfg.logical_cpus)
    if cfg.strategy == "multi_worker":
        os.environ[DEFER_DEVICES_ENV] = "1"


def configure(cfg):
    """The run's Distribution; call before TensorFlow creates its devices (the CPU can be split
    into logical devices only then)."""
    check_flags(cfg)
    if cfg.strategy == "one_device":
        return Distribution(None)
    import tensorflow as tf

    if cfg.strategy == "mirrored":
        if cfg.logical_cpus:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            if len(devices) < cfg.logical_cpus:
                raise UserError(f"--logical_cpus {cfg.logical_cpus}: TensorFlow started before "
                                f"the CPU could be split ({len(devices)} CPU device now); set "
                                f"{LOGICAL_CPUS_ENV}={cfg.logical_cpus} before the process "
                                f"imports TensorFlow")
            devices = devices[:cfg.logical_cpus]
        else:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
            if len(devices) < 2:
                raise UserError(f"--strategy mirrored found {len(devices)} GPU(s): it needs two "
                                f"devices or more; pass --logical_cpus N to split the CPU into N")
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        resolver = _cluster_resolver()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    dist = Distribution(strategy)
    if cfg.batch_size % dist.num_replicas:
        raise UserError(f"--batch_size {cfg.batch_size} (the global batch) does not divide "
                        f"among the {dist.num_replicas} replicas; pass a multiple of "
                        f"{dist.num_replicas}")
    return dist


class Distribution:
    """The run's tf.distribute strategy (None: one device) and where this process stands."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.num_replicas = strategy.num_replicas_in_sync if strategy else 1
        resolver = getattr(getattr(strategy, "cluster_resolver", None), "task_type", None)
        self.multi_worker = resolver is not None
        if self.multi_worker:
            spec = strategy.cluster_resolver.cluster_spec().as_dict()
            kind, index = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
            self.num_workers = sum(len(v) for k, v in spec.items() if k in ("chief", "worker"))
            self.is_chief = kind == "chief" or (kind == "worker" and index == 0
                                                and "chief" not in spec)
            self.worker = f"{kind} {index}"
        else:
            self.num_workers, self.is_chief, self.worker = 1, True, "chief"
        # bytes all-reduced by each traced step, recorded at trace time (see step builders)
        self.allreduce_bytes = {}

    @property
    def on(self):
        return self.strategy is not None

    def scope(self):
        import contextlib

        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    def barrier(self):
        """Wait until every worker is here (a multi-worker run; else nothing)."""
        if self.multi_worker:
            import tensorflow as tf

            self.strategy.reduce(tf.distribute.ReduceOp.SUM,
                                 self.strategy.run(lambda: tf.constant(1.0)), axis=None).numpy()

    def checksums(self, variables):
        """(checksums, agree): one float per local replica (sum of the weights and of their
        squares, in float64), and whether every replica of every worker holds the same."""
        if not self.strategy:
            return [_checksum([v.numpy() for v in variables])], True
        import tensorflow as tf

        from elastictrainer.flavors.optimizers import tf_variable

        copies = [self.strategy.experimental_local_results(tf_variable(v)) for v in variables]
        local = [_checksum([c[r].numpy() for c in copies]) for r in range(len(copies[0]))]
        every = local
        if self.multi_worker:  # every worker's, gathered
            mine = local[0]
            every = self.strategy.gather(self.strategy.run(
                lambda: tf.constant([mine], tf.float64)), axis=0).numpy().tolist()
        return local, bool(min(every) == max(every))

    def global_batches(self, dataset, global_batch):
        """The training set as whole global batches (a last, partial one would split unevenly
        among the replicas)."""
        return dataset.rebatch(global_batch, drop_remainder=True) if self.strategy else dataset

    def split(self, batch, global_batch):
        """A global batch as distributed values, each replica its slice.  Every worker reads
        every global batch from its own iterator (the same data, the same order: a plain
        tf.data iterator, which a checkpoint saves, where tf.distribute's distributed iterators
        cannot be saved) and takes its replicas' slices."""
        if not self.strategy:
            return batch
        per_replica = global_batch // self.num_replicas

        def value(context):
            i = context.replica_id_in_sync_group
            return tuple(t[i * per_replica:(i + 1) * per_replica] for t in batch)

        return self.strategy.experimental_distribute_values_from_function(value)


def _checksum(arrays):
    import numpy as np

    return float(sum(np.sum(a, dtype=np.float64) + np.sum(np.square(a, dtype=np.float64))
                     for a in arrays))
