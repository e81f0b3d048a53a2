"""The timing table's files: where a table lives (and its profiling's trace), writing it, and
reading it back for a configuration.

No TensorFlow: training, plotting and the figure driver read tables without starting it.

The format is table_format.py's: load_table reads every file through TimingTable.from_dict,
which validates it and migrates an older table.  load_table still returns a plain dict, the
migrated table's to_dict(): the time model, the plots and the scripts index tables by key in
many places and receive the profiler's own dict too, and that dict has every declared key
whichever version of the profiler wrote the file.
"""
import json
import os

from elastictrainer import flavors, runlog
from elastictrainer.errors import UserError
from elastictrainer.profiler.table_format import DEFAULT_OPTIMIZER, TimingTable

PROFILE_DIR = "profiles"


def default_table_path(model_name, input_size, batch_size, num_classes,
                       optimizer=DEFAULT_OPTIMIZER, folder=PROFILE_DIR):
    """Where the profiler writes, and training looks for, a model configuration's table.

    SGD tables keep the reference's name (<model>_i<input>_b<batch>_c<classes>.json); another
    optimizer's update ops cost differently, so its table gets its own name (..._adam.json).
    """
    stem = os.path.splitext(os.path.basename(str(model_name)))[0]
    suffix = "" if optimizer == DEFAULT_OPTIMIZER else f"_{optimizer}"
    return os.path.join(folder, f"{stem}_i{input_size}_b{batch_size}_c{num_classes}{suffix}.json")


def default_trace_dir(table_name, logdir="logs"):
    """Where `profile` keeps its trace by default: logs/<table name>_profile, beside the runs,
    so that `tensorboard --logdir logs` lists it in its Profile tab (tf.profiler writes
    <trace dir>/plugins/profile/<time>/<host>.xplane.pb, the layout that tab reads)."""
    return os.path.join(logdir, f"{table_name}_profile")


def save_table(table, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    runlog.write_json(path, table)  # a table is either whole or absent, even if interrupted


def table_optimizer(table):
    return table.get("optimizer", DEFAULT_OPTIMIZER)


def load_table(path, model=None, input_size=None, batch_size=None, optimizer=None):
    """Read a timing table; reject a corrupt file, one of a newer format, or one made for
    another configuration.

    Returns a plain dict, TimingTable.to_dict() of the migrated table (see the module doc): every
    key the format declares is present, with migrate_table's default where an older table
    lacks it."""
    if not os.path.exists(path):
        raise UserError(f"no timing table at {path}; run profiler.py first")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"corrupt timing table {path}: {e}") from None
    table = TimingTable.from_dict(raw, path)
    if input_size is not None and table.input_size != input_size:
        raise UserError(f"timing table {path} was profiled at input size {table.input_size}, "
                        f"not {input_size}; re-run profiler.py")
    if batch_size is not None and table.batch_size != batch_size:
        raise UserError(f"timing table {path} was profiled at batch size {table.batch_size}, "
                        f"not {batch_size}; re-run profiler.py")
    if optimizer is not None and table.optimizer != optimizer:
        raise UserError(f"timing table {path} was profiled with --optimizer "
                        f"{table.optimizer}, not {optimizer}, whose updates cost "
                        f"differently; re-run profiler.py --optimizer {optimizer}, or pass "
                        f"another --timing_table")
    if model is not None:
        names = [flavors.tensor_name(v) for v in model.trainable_weights]
        got = [t.name for t in table.tensors]
        if len(names) != len(got):
            raise UserError(f"timing table {path} has {len(got)} tensors but the model has "
                            f"{len(names)}; re-run profiler.py for this model")
        # Shapes decide where the table has them: Keras numbers the layers of every model
        # built in a process (conv2d, conv2d_1, ...), so the same model built again has other
        # names but the same tensors.
        shapes = [[int(d) for d in v.shape] for v in model.trainable_weights]
        for k, t in enumerate(table.tensors):
            if (t.shape is not None and t.shape != shapes[k]) or (
                    t.shape is None and t.name != names[k]):
                what = (f"{t.name!r} of shape {t.shape}" if t.shape is not None
                        else repr(t.name))
                raise UserError(f"timing table {path} does not match the model: tensor {k} is "
                                f"{what} in the table, {names[k]!r} of shape {shapes[k]} in "
                                f"the model")
    return table.to_dict()
