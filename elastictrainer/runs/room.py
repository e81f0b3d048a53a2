"""What a run will write under --logdir, estimated before it loads a table or profiles, against
the free space of the disk (check_room).

The estimate: checkpoints (--keep_checkpoints kept, and one more while one is saved) of the
model's variables and the optimizer's slots (SGD's momentum one per trainable tensor, Adam's
two), TensorBoard's events (per epoch and per re-selection, measured on smallcnn runs: about
45 KB a run starts and ends with, 2 KB per epoch of scalars, 45 KB per re-selection, most of
it the heat map image), summary.json and the best weights (--save_model).  The prefix cache's disk store is not
counted: it plans its own room, leaving a reserve free (prefix/store.py), and turns itself off
on a full disk.

Checkpoints that do not fit are an error (exit 2): the run would fail at its first or its
third save, hours of a small device's training lost.  Their variables' bytes are exact; the
input pipelines' state they also hold (a shuffle buffer: 0.6 MB of smallcnn's 1.5 MB on
synthetic 32 px data) is not counted, so this errs on the side of starting.
The rest is a warning: events and summaries are a model of what is written, a full disk later
stops the run cleanly and resumably (runs/disk.py), and the user may free space as it runs.
"""
import os
import shutil

from elastictrainer.errors import UserError

OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2}  # per trainable tensor (flavors/optimizers.py)
EVENTS_RUN_BYTES = 48 << 10
EVENTS_EPOCH_BYTES = 4 << 10
EVENTS_SELECTION_BYTES = 48 << 10
SUMMARY_BYTES = 16 << 10  # beside its selections' masks, one int per tensor each
MB = 2 ** 20


def free_bytes(path):
    """Free bytes on the disk under `path` (tests give another function)."""
    return shutil.disk_usage(path).free


def variable_bytes(variables):
    """Bytes of tf-keras or Keras 3 variables (whose dtype is a name and shape a tuple)."""
    import math

    import tensorflow as tf

    return sum(math.prod(int(d) for d in v.shape) * tf.as_dtype(v.dtype).size
               for v in variables)


def estimate(model, cfg, elastic):
    """{part: bytes} a run of `cfg` writes under its run directory."""
    trainable = variable_bytes(model.trainable_weights)
    checkpoint = variable_bytes(model.weights) + OPTIMIZER_SLOTS.get(cfg.optimizer, 2) * trainable
    selections = (cfg.num_epochs // max(cfg.interval, 1) + 1) if elastic else 0
    masks = selections * 4 * len(model.trainable_weights)
    return {
        # --keep_checkpoints kept, and one more written before the oldest goes
        "checkpoints": (cfg.keep_checkpoints + 1) * (checkpoint + 2 * masks),
        "events": (EVENTS_RUN_BYTES + EVENTS_EPOCH_BYTES * cfg.num_epochs
                   + EVENTS_SELECTION_BYTES * selections),
        "summary": SUMMARY_BYTES + masks,
        "best weights": variable_bytes(model.weights) if cfg.save_model else 0,
    }


def check_room(model, cfg, out, elastic, log):
    """Refuse (UserError) a run whose checkpoints will not fit in the free space under --logdir,
    warn in one line when the rest of what it writes will not (the module's docstring says
    why); a resumed run counts what its directory already holds as written."""
    parts = estimate(model, cfg, elastic)
    written = _bytes_under(out)
    free = free_bytes(cfg.logdir)
    ckpt_need = max(parts["checkpoints"] - written, 0)
    need = max(sum(parts.values()) - written, 0)
    said = (f"{out} needs about {need / MB:.1f} MB ({parts['checkpoints'] / MB:.1f} MB of "
            f"checkpoints, {parts['events'] / MB:.1f} MB of TensorBoard events) but its disk "
            f"has {free / MB:.1f} MB free")
    if ckpt_need > free:
        raise UserError(f"{said}: its checkpoints do not fit; free space or pass another "
                        f"--logdir")
    if need > free:
        log(f"warning: {said}; free space, pass another --logdir or fewer --num_epochs, or the "
            f"run stops when the disk is full (run the same command to resume)")


def _bytes_under(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
