"""Run directory layout, TensorBoard tags and file formats: defined once, used by the training
loop that writes them and by the plotting scripts that read them."""
import contextlib
import dataclasses
import errno
import json
import os
from typing import List, Optional

from elastictrainer.flavors import compat

# Scalar tags (the reference's names, so its TensorBoard habits carry over).
TRAIN_ACCURACY = "train/accuracy"
TRAIN_LOSS = "train/classification_loss"
LEARNING_RATE = "train/learning_rate"
TEST_ACCURACY = "test/accuracy"
TEST_LOSS = "test/classification_loss"
ENERGY_JOULES = "energy/joules"  # per epoch, training energy so far (where a sensor exists)
# Elastic schemes, one point per re-selection.
NUM_SELECTED = "elastic/num_selected"
PREDICTED_RATIO = "elastic/predicted_step_ratio"
SELECTION_RHO = "elastic/selection_rho"  # the ratio each selection is held to (rho auto: its own)
# rho auto: the share of the estimated loss drop each selection keeps, and the predicted ratio
# and share of the objective's best selection of another deepest tensor (elastic/budget.py)
SELECTION_IMPORTANCE_SHARE = "elastic/selection_importance_share"
RUNNER_UP_RATIO = "elastic/runner_up_predicted_step_ratio"
RUNNER_UP_IMPORTANCE_SHARE = "elastic/runner_up_importance_share"
MEASURED_RATIO = "elastic/measured_step_ratio"  # median selection step / median full step, same run
WALL_RATIO = "elastic/wall_clock_ratio"  # at the end: training time / full training's, estimated in the run (elastic.wall_ratio)
CORRECTIONS = "elastic/rho_corrections"  # running count of closed-loop corrections (rho_control.py)
SELECTION_MASK = "elastic/selection_mask"  # tensor summary: 1 = trained, model.trainable_weights order
# TensorBoard's other dashboards (runs/board.py): the selections' heat map (an image at each
# re-selection and at the end), the configuration and the closing line (text), and what the
# HParams dashboard lines up for the run (scalars at its last step).
SELECTION_IMAGE = "elastic/selection_heatmap"
CONFIG_TEXT = "run/config"
RESULT_TEXT = "run/closing_line"  # sorts before run/config: the Text dashboard shows it first
# The HParams dashboard offers every scalar tag as a metric and shows the first five by name:
# "compare/" sorts before "elastic/", so these five are the ones it shows.
BEST_ACCURACY = "compare/best_test_accuracy"  # %
TRAIN_TIME = "compare/train_time_s"
TIME_OVER_FULL = "compare/time_over_full"  # training time / full training's (wall_ratio; 1 for full)
RUN_MEASURED_RATIO = "compare/measured_step_ratio"  # the run's (summary.json measured_ratio)
TENSORS_TRAINED = "compare/tensors_trained"  # mean over the steps that updated weights

def rho_text(rho):
    """How a run's rho reads in a line or a table: "0.5", or "auto" (--rho auto)."""
    return rho if isinstance(rho, str) else f"{rho:g}"


CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
BEST_WEIGHTS_FILE = "best.weights.h5"
SCALAR_EVERY_STEPS = 200  # the reference's logging period for train scalars


# Version of summary.json's layout (RunSummary); readers accept any earlier one.
SUMMARY_VERSION = 4


@dataclasses.dataclass
class EpochRecord:
    """One finished epoch, as summary.json's "epochs" lists it."""
    epoch: int
    train_time_s: float
    test_accuracy: float
    test_loss: float
    train_accuracy: float
    train_loss: float
    selected: int
    energy_j: Optional[float] = None


@dataclasses.dataclass
class RunSummary:
    """summary.json: what a run did, written at its start, after every epoch and at its end.
    The elastic fields (rho_feedback to plan) stay None for the fixed schemes; "selections"
    holds elastic.SelectionRecord dicts and "corrections" elastic.Correction dicts."""
    train_type: str
    model: str
    dataset: str
    rho: Optional[float]
    seed: int
    num_tensors: int
    tensor_names: List[str]
    timing_table: Optional[str]
    steps_per_epoch: int
    status: str = "running"  # running, finished, interrupted, failed, nan
    best_test_accuracy: Optional[float] = None
    train_time_s: float = 0.0
    epochs: List[dict] = dataclasses.field(default_factory=list)
    selections: List[dict] = dataclasses.field(default_factory=list)
    skipped_images: int = 0
    skipped_files: List[str] = dataclasses.field(default_factory=list)
    energy_j: Optional[float] = None
    avg_power_w: Optional[float] = None
    energy_source: Optional[str] = None
    rho_feedback: Optional[bool] = None
    measured_ratio: Optional[float] = None
    # the time model's step ratio, weighted as measured_ratio: what stands in when none was
    # measured (the closing line says why)
    estimated_ratio: Optional[float] = None
    corrections: List[dict] = dataclasses.field(default_factory=list)
    reselection_overhead_s: Optional[float] = None
    reselection_overhead_parts_s: Optional[dict] = None
    wall_ratio: Optional[float] = None
    # seconds this run spent profiling its timing table (0 when it read one): the method's own
    # cost, which full training does not pay, so wall_ratio counts it (elastic/accounting.py)
    profiling_s: Optional[float] = None
    # whether train_time_s (and each epoch's) already holds profiling_s: model.fit profiles on
    # its first batch, inside its clock; the command line profiles before its loop
    profiling_in_train_time: Optional[bool] = None
    # what the elastic runtime's economy chose (full training or selections) and why, the
    # compile it priced and where from, and what it held back (elastic/economy.py)
    economy: Optional[dict] = None
    plan: Optional[dict] = None
    step_cache_traces: Optional[int] = None
    peak_rss_mb: Optional[float] = None
    # under tf.distribute (--strategy): replicas, and the gradient bytes one step all-reduces,
    # the run's mean and full training's
    strategy: Optional[str] = None
    replicas: Optional[int] = None
    allreduce_bytes_per_step: Optional[float] = None
    full_allreduce_bytes_per_step: Optional[float] = None
    # a multi-worker elastic run's other all-reduce, every step: the chief's decision (the
    # step's kind and selection), read from its traced graph; gradients it is not, so apart
    decision_allreduce_bytes_per_step: Optional[float] = None
    # what this process's steps ran, [global step, kind, tensors] where it changed, and its
    # replicas' weight checksums at the end (every replica and worker must agree)
    ran: List[list] = dataclasses.field(default_factory=list)
    replica_checksums: Optional[List[float]] = None
    replicas_agree: Optional[bool] = None
    # --cache_frozen_prefix: its cut points, stores (cut, size, memory or file, fill time),
    # and the share of the run's steps served from it (prefix_cache.PrefixCache.summary)
    prefix_cache: Optional[dict] = None
    error: Optional[str] = None
    version: int = SUMMARY_VERSION

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def run_dir(logdir, run_name):
    return os.path.join(logdir, run_name)


TMP_SUFFIX = ".tmp"  # a file being written; never read, removed when its write fails


def replace_durably(path, write, tmp=None):
    """Put a new `path` in place whole and on the disk before it counts: `write(tmp)` writes the
    file at the temporary name (path + TMP_SUFFIX unless given), which is flushed to the disk,
    renamed over `path`, and the directory's entry flushed too.  A power cut leaves the old
    file or the new one, never a truncated one (a rename alone does not: the file system may
    commit the rename before the data).  A failed write (a full disk) removes the temporary
    file and raises."""
    tmp = tmp or path + TMP_SUFFIX
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDWR)  # writable: Windows flushes no read-only handle
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(directory):
    """Flush a directory's entries (a rename into it) to the disk, where the system can."""
    if os.name == "nt":  # Windows opens no directory for fsync; its renames are journaled
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # some file systems (network, FUSE) do not flush directories; the rename stands
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def as_json(value):
    """`value` as a JSON file gives it back (tuples as lists): what a saved config.json or
    figures file is compared with."""
    return json.loads(json.dumps(value))


def write_json(path, obj):
    """Write whole-or-nothing and durably (replace_durably): what a resume reads is never half
    a file."""
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
    replace_durably(path, write)


def write_text(path, text):
    """`text` as the file `path`, whole-or-nothing and durably (replace_durably)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    replace_durably(path, write)


def truncate_events(run_directory, wall_time):
    """Drop the TensorBoard events a run wrote after `wall_time` (its last checkpoint): a
    resumed run writes those steps again, and TensorBoard would show them twice.  Each event
    file is rewritten whole-or-nothing.  TensorFlow's TFRecord reader and writer; event files
    are TFRecords of Event protos."""
    import tensorflow as tf

    for name in sorted(os.listdir(run_directory)):
        if not name.startswith("events.out.tfevents"):
            continue
        path = os.path.join(run_directory, name)
        kept, dropped = [], 0
        try:
            for record in tf.data.TFRecordDataset(path):
                raw = record.numpy()
                if tf.compat.v1.Event.FromString(raw).wall_time <= wall_time:
                    kept.append(raw)
                else:
                    dropped += 1
        except tf.errors.DataLossError:  # a write cut short by the kill: its tail is lost
            dropped += 1
        if not dropped:
            continue

        def write(tmp, kept=kept):
            with tf.io.TFRecordWriter(tmp) as w:
                for raw in kept:
                    w.write(raw)
        replace_durably(path, write)


def read_summary(run_directory):
    with open(os.path.join(run_directory, SUMMARY_FILE)) as f:
        return json.load(f)


def run_status(run_directory):
    """The run's status as its summary.json says it ("running", "finished", ...), None when
    there is no summary yet or it cannot be read."""
    try:
        return read_summary(run_directory).get("status")
    except (OSError, ValueError):
        return None


def finished_summary(run_directory):
    """The run's summary when it finished, else None (no summary yet, an unreadable one, or a
    run that stopped or failed): what benchmarks and sweeps read instead of running again."""
    try:
        summary = read_summary(run_directory)
    except (OSError, ValueError):
        return None
    return summary if summary.get("status") == "finished" else None


def read_config(run_directory):
    with open(os.path.join(run_directory, CONFIG_FILE)) as f:
        return json.load(f)


def open_events(run_directory):
    """An EventAccumulator over every event file of a run, fully loaded (pass it to the readers
    below to read several tags with one pass over the files)."""
    # TensorBoard's own TensorFlow stub, so that plotting does not start TensorFlow (seconds,
    # and its banners)
    compat.tensorboard_without_tensorflow()
    return compat.load_events(run_directory)


def read_tensors(run_directory, tag, accumulator=None):
    """(steps, arrays) of a tensor summary tag in step order; empty lists if absent."""
    acc = accumulator or open_events(run_directory)
    if tag not in acc.Tags().get("tensors", []):
        return [], []
    events = sorted(acc.Tensors(tag), key=lambda e: e.step)
    return [e.step for e in events], [compat.tensor_event_array(e) for e in events]


def read_scalars(run_directory, tag, accumulator=None):
    """(steps, values) of a scalar tag as float numpy arrays in step order; empty if absent.

    TF2's tf.summary.scalar writes tensor events; TF1-style scalar events are read as well.
    """
    import numpy as np
    acc = accumulator or open_events(run_directory)
    tags = acc.Tags()
    if tag in tags.get("tensors", []):
        steps, arrays = read_tensors(run_directory, tag, acc)
        values = [float(np.asarray(a).reshape(-1)[0]) for a in arrays]
    elif tag in tags.get("scalars", []):
        events = sorted(acc.Scalars(tag), key=lambda e: e.step)
        steps, values = [e.step for e in events], [e.value for e in events]
    else:
        steps, values = [], []
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)
