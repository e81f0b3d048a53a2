"""The timing table a model.fit run uses (paper Sec. 5's table, for ElasticCallback in
callback.py): where it is looked for, whether one found there fits the model, and profiling the
model on fit's first batch when none does.

model.fit has no --model_name to name a table by, and Keras numbers the layers of every model
built in a process, so a table is named by the model's name and a digest of its tensors' shapes,
and one found is judged by those shapes, not by the tensors' names.  Profiling runs in this
process on the batch fit brings, with the model's compiled loss and a fresh copy of its
optimizer's kind (profiler/run.py's profile_model); it leaves the model's random streams and
metrics as they were, so that a run that profiled first trains as one that found its table.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import hashlib
import os

import tensorflow as tf

from elastictrainer.profiler import calibration, table as tables


def batch_shape(flavor, model, data):
    """(batch_size, input_size, num_classes) of a fit batch (this process's part of it) and the
    model: the configuration a table is profiled for."""
    x, _, _ = flavor.keras.utils.unpack_x_y_sample_weight(data)
    x0 = tf.nest.flatten(x)[0]
    batch_size = int(x0.shape[0])
    input_size = int(x0.shape[1]) if len(x0.shape) > 1 else 1
    return batch_size, input_size, int(model.output_shape[-1])


def default_path(model, input_size, batch_size, num_classes, optimizer, folder):
    """Where a model.fit run looks for (and writes) its model's table under `folder`."""
    return tables.default_table_path(f"{model.name}-{architecture_digest(model)}", input_size,
                                     batch_size, num_classes, optimizer, folder=folder)


def architecture_digest(model):
    """A short digest of the model's trainable tensors (their shapes, in order): tables of
    models that share a name but not their tensors do not collide, and a model built again
    (whose layers Keras may number anew) finds its table."""
    text = ";".join(str(tuple(v.shape)) for v in model.trainable_weights)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def matches(table, model):
    """Whether a table's tensors have the model's shapes, in order (their names may differ:
    Keras numbers the layers of every model built in a process)."""
    return [t["shape"] for t in table["tensors"]] == [
        [int(d) for d in v.shape] for v in model.trainable_weights]


def ensure(path, model, flavor, data, input_size, batch_size, num_classes, run_steps, log,
           clock):
    """Make sure `path` holds a table this run can use: one there already (of the model's
    shapes, calibrated as `run_steps` needs, calibration.recalibrate_reason), else one made on
    `data` (profile).  Returns the seconds spent making it (0.0 when one was there), read on
    `clock` around the profiling alone."""
    found = tables.load_table(path) if os.path.exists(path) else None
    stale = found is not None and calibration.recalibrate_reason(found, run_steps)
    if found is not None and matches(found, model) and not stale:
        return 0.0
    if stale:
        log(f"the timing table at {path} cannot be used: {stale}")
    t0 = clock()
    profile(path, model, flavor, data, input_size, batch_size, num_classes, run_steps, log)
    return clock() - t0


def profile(path, model, flavor, data, input_size, batch_size, num_classes, run_steps, log):
    """Write at `path` the table this process profiled for the same model and batch
    (profiler/reuse.py), or else one profiled now on `data`."""
    from elastictrainer.profiler import report, reuse
    from elastictrainer.profiler.phases import phases_text
    from elastictrainer.profiler.run import profile_model

    x, y, _ = flavor.keras.utils.unpack_x_y_sample_weight(data)
    # the batch's structure, the compiled loss and the optimizer make the step profiled
    table_key = reuse.key(
        model, batch=[[list(map(int, t.shape)), str(t.dtype)] for t in tf.nest.flatten((x, y))],
        num_classes=num_classes, optimizer=reuse.describe(model.optimizer),
        loss=reuse.describe(getattr(model, "loss", None)), profiled="fit")
    table = reuse.get(table_key, model, model.name)
    if table is not None and not calibration.recalibrate_reason(table, run_steps):
        log(f"no timing table at {path}: reusing the one profiled in this process for the same "
            f"model and batch")
        tables.save_table(table, path)
        return
    log(f"no timing table at {path}: profiling {model.name} on this batch first")
    states = [(v, v.numpy()) for v in flavor.random_state_variables(model)]
    table = profile_model(model, model.name, input_size, batch_size, num_classes,
                          optimizer=model.optimizer, batch=(x, y),
                          loss_fn=flavor.fit_loss_fn(model), progress=False,
                          run_steps=run_steps)
    for v, value in states:  # profiling must not move the run's random streams
        v.assign(value)
    model.reset_metrics()  # nor count in its first epoch's metrics
    tables.save_table(table, path)
    reuse.put(table_key, table)
    log(phases_text(table["profiling_phases_s"], "in this process"))
    log(report.summarize(table))
