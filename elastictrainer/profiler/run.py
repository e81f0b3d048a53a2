"""The profiler's driver (paper Sec. 5): profile a model's training step, write its table.

We trace the very training step that training runs (engine.make_train_step, with the run's
optimizer, whose update ops differ: SGD with momentum and weight decay, or Adam), attribute every
traced op to the trainable tensors by dataflow, and calibrate the time model on a few timed
partial selections.
"""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import datetime
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

from elastictrainer import engine
from elastictrainer.common import UserError, peak_rss_mb
from elastictrainer.profiler import attribution, calibration, table as tables, trace
from elastictrainer.profiler.dataflow import GraphInfo
from elastictrainer.time_model import selection_sums, uniform_scale


def profile_model(model, model_name, input_size, batch_size, num_classes, num_iterations=5,
                  warmup=2, trace_dir=None, seed=0, progress=True, calibrate=True,
                  optimizer="sgd"):
    """Profile full training steps of `model` and return the timing table (a JSON-able dict).

    Runs `warmup` steps, then times forward-only and full training steps interleaved
    (median wall time: t_fp, t_full; t_bp = t_full - t_fp, measured, not the 2 x forward rule),
    then traces `num_iterations` full steps under tf.profiler and attributes their ops.
    With `calibrate`, a few reference selections are then timed for real to fit separate
    t_dw / t_dy scales (calibration.fit_calibration).  `optimizer` is the training run's
    (engine.OPTIMIZERS): its update ops are part of every tensor's t_dw.  The model's weights
    are restored afterwards.
    """
    from tqdm import tqdm

    if num_iterations < 1:
        raise UserError("--num_iterations must be at least 1")
    wall0 = time.perf_counter()
    variables = list(model.trainable_weights)
    if not variables:
        raise UserError("the model has no trainable weights to profile")
    saved = model.get_weights()
    # The learning rate's value does not change the ops a step runs, only the optimizer does.
    opt = engine.make_optimizer(optimizer, 1e-4, 5e-4, total_steps=1000)
    engine.prepare_optimizer(opt, variables)
    loss_fn = engine.make_loss()
    capture = {}
    step = engine.make_train_step(model, opt, loss_fn, variables, capture=capture)
    forward = engine.make_forward_step(model, loss_fn)

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.uniform(0, 255, (batch_size, input_size, input_size, 3)), tf.float32)
    y = tf.constant(rng.integers(0, num_classes, batch_size), tf.int32)

    n_refs = len(calibration.reference_selections(np.arange(len(variables)))) if calibrate else 0
    bar = tqdm(total=warmup + 3 * num_iterations + (n_refs + num_iterations if n_refs else 0),
               desc="profiling", disable=not progress, unit="step")
    for _ in range(warmup):
        step(x, y)[0].numpy()
        forward(x, y)[0].numpy()
        bar.update(1)
    graph = step.get_concrete_function(x, y).graph
    info = GraphInfo(graph, capture["loss"], capture["grads"], variables, opt.variables)

    fp, full = [], []
    for _ in range(num_iterations):
        t0 = time.perf_counter()
        forward(x, y)[0].numpy()
        fp.append(time.perf_counter() - t0)
        bar.update(1)
        t0 = time.perf_counter()
        step(x, y)[0].numpy()
        full.append(time.perf_counter() - t0)
        bar.update(1)

    own_dir = trace_dir is None
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="et_trace_")
    tf.profiler.experimental.start(trace_dir)
    try:
        for _ in range(num_iterations):
            step(x, y)[0].numpy()
            bar.update(1)
    finally:
        tf.profiler.experimental.stop()
    xplane = trace.find_xplane(trace_dir)
    op_times, kernel_type = trace.read_op_times(xplane)
    if own_dir:
        shutil.rmtree(trace_dir, ignore_errors=True)
    att = attribution.attribute(info, op_times, kernel_type, num_iterations)
    references = {}
    if n_refs:
        references = calibration.time_reference_selections(
            model, opt, loss_fn, variables, step, info.rank, x, y, num_iterations, bar)
    bar.close()
    model.set_weights(saved)

    t_dw, estimated = att["t_dw"], [not c for c in att["covered"]]
    if any(estimated):
        t_dw, estimated = attribution.fill_estimates(t_dw, att["covered"],
                                                     info.dw_flops(variables, batch_size))
    t_dy = att["t_dy"]
    t_fp = statistics.median(fp) * 1e3
    t_full = statistics.median(full) * 1e3
    timing_note = None
    if not t_fp < t_full:
        # Steps of a few ms on a busy machine can time the forward pass slower than the whole
        # step; the trace's op times still tell the forward share, so take it from them.
        share = att["t_fp_ops_ms"] / max(att["t_fp_ops_ms"] + att["t_bp_ops_ms"], 1e-12)
        timing_note = (f"timed forward {t_fp:.3g} ms >= full step {t_full:.3g} ms (a busy "
                       f"machine?): t_fp_ms set to the traced forward share {share:.2f} of it")
        t_fp = t_full * share
    return {
        "version": tables.TABLE_VERSION,
        "model": str(model_name),
        "input_size": int(input_size),
        "batch_size": int(batch_size),
        "num_classes": int(num_classes),
        "optimizer": optimizer,
        "t_fp_ms": t_fp,
        "t_full_ms": t_full,
        "t_bp_ms": t_full - t_fp,
        "t_fp_ops_ms": att["t_fp_ops_ms"],
        "t_bp_ops_ms": att["t_bp_ops_ms"],
        "coverage": att["coverage"],
        "unattributed": att["unattributed"][:50],
        "num_iterations": int(num_iterations),
        "timing_note": timing_note,
        "calibration": _calibration_record(t_dw, t_dy, info.rank, t_fp, t_full, references),
        "tensors": [
            {"name": v.name, "shape": [int(d) for d in v.shape], "t_dw_ms": t_dw[k],
             "t_dy_ms": t_dy[k], "estimated": estimated[k], "rank": info.rank[k]}
            for k, v in enumerate(variables)
        ],
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "processor": platform.machine(),
                 "tensorflow": tf.__version__,
                 "devices": [d.name for d in tf.config.list_logical_devices()]},
        "trace": None if own_dir else xplane,
        "profiling_wall_s": time.perf_counter() - wall0,
        "peak_rss_mb": peak_rss_mb(),
    }


def _calibration_record(t_dw, t_dy, rank, t_fp, t_full, references):
    """The table's `calibration`: fitted scales and each timed reference's ratios; None when no
    reference was timed."""
    if not references:
        return None
    a, b = calibration.fit_calibration(t_dw, t_dy, rank, t_fp, t_full, references)
    uniform = uniform_scale(t_dw, t_dy, t_fp, t_full)

    def ratio(scale_dw, scale_dy, mask):
        dw, dy = selection_sums(t_dw, t_dy, rank, mask)
        return (t_fp + scale_dw * dw + scale_dy * dy) / t_full

    return {
        "dw_scale": a, "dy_scale": b, "uniform_scale": uniform,
        "references": [
            {"name": name, "selected": int(np.sum(mask)), "measured_ratio": r,
             "uniform_ratio": ratio(uniform, uniform, mask), "calibrated_ratio": ratio(a, b, mask)}
            for name, (mask, r) in references.items()],
    }


def load_or_profile(path, model, model_name, input_size, batch_size, num_classes, seed=0,
                    progress=True, log=print, optimizer="sgd"):
    """The table at `path` for `model`, profiling `model` first when there is none."""
    if not os.path.exists(path):
        log(f"no timing table at {path}: profiling this configuration first (profiler.py)")
        table = profile_model(model, model_name, input_size, batch_size, num_classes,
                              progress=progress, seed=seed, optimizer=optimizer)
        tables.save_table(table, path)
        log(tables.summarize(table))
    return tables.load_table(path, model=model, input_size=input_size, batch_size=batch_size,
                             optimizer=optimizer)


def profile_configuration(model_name, input_size=224, batch_size=4, num_classes=None,
                          weights="none", num_iterations=5, warmup=2, output=None,
                          trace_dir=None, figure=None, seed=0, progress=True, calibrate=True,
                          optimizer="sgd"):
    """Build the model, profile it, write the table (and its figure); return (table, path)."""
    from elastictrainer import plotting
    from elastictrainer.models.build import build_sized

    model, input_size, num_classes = build_sized(model_name, input_size, num_classes, weights)
    output = output or tables.default_table_path(model_name, input_size, batch_size, num_classes,
                                                 optimizer)
    stem = os.path.splitext(os.path.basename(output))[0]
    trace_dir = trace_dir or os.path.join(os.path.dirname(output) or ".", "traces", stem)
    table = profile_model(model, model_name, input_size, batch_size, num_classes,
                          num_iterations=num_iterations, warmup=warmup, trace_dir=trace_dir,
                          seed=seed, progress=progress, calibrate=calibrate, optimizer=optimizer)
    tables.save_table(table, output)
    if figure != "":
        plotting.draw_profile(table, figure or os.path.join("figures", f"profile_{stem}.png"))
    return table, output
