"""A profiling's measurements as its timing table (paper Sec. 5): what run.py's profile_model
returns once it has timed, traced and attributed the training step.

The steps' wall times become medians in ms; a tensor the trace missed gets its t_dw estimated
from FLOPs (attribution.fill_estimates); a forward pass timed slower than the whole step (a
busy machine) is replaced by the traced forward share; the timed reference selections become
the fitted calibration (calibration.fit_fixed_cost) with each one's predicted ratios beside its
measured one; and the table records where and how it was made.  The keys are the format's
(table_format.TimingTable), in its order.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import datetime
import os
import platform
import statistics

import numpy as np
import tensorflow as tf

from elastictrainer import flavors
from elastictrainer.machine import peak_rss_mb
from elastictrainer.profiler import attribution, calibration, table_format
from elastictrainer.method.time_model import selection_sums, uniform_scale


def timing_table(model_name, input_size, batch_size, num_classes, optimizer, variables, info,
                 att, fp_layers, times, num_iterations, compile_ms, references, skipped,
                 trace, phases, clock, started):
    """The table (a JSON-able dict) of a profiling of `variables` (the model's trainable
    tensors) with `optimizer` (its name): `info`, the step's dataflow.GraphInfo; `att`,
    attribution.attribute's result and `fp_layers` its forward time by layer; `times`, the
    timed steps' seconds (forward, full, no-update); `references`, the timed reference
    selections ({} when none was timed) and `compile_ms` the longest of their compiles (or the
    probe step's); `skipped`, why the calibration was skipped (None); `trace`, the kept
    .xplane.pb (None); `phases`, where the profiling's seconds went; `started`, the profiling's
    start on `clock`, read again here for its wall time."""
    fp, full, grads = times
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
        "version": table_format.TABLE_VERSION,
        "model": str(model_name),
        "input_size": int(input_size),
        "batch_size": int(batch_size),
        "num_classes": int(num_classes),
        "optimizer": optimizer,
        "t_fp_ms": t_fp,
        "t_full_ms": t_full,
        "t_bp_ms": t_full - t_fp,
        # a full step without the optimizer's update: how much of a step the update is
        "t_grads_ms": statistics.median(grads) * 1e3,
        "t_fp_ops_ms": att["t_fp_ops_ms"],
        "t_bp_ops_ms": att["t_bp_ops_ms"],
        "t_fp_layers_ms": fp_layers,
        "coverage": att["coverage"],
        "unattributed": att["unattributed"][:50],
        "num_iterations": int(num_iterations),
        "timing_note": timing_note,
        # compiling a selection's step (the longest of the calibration's references', else
        # the probe step's when the calibration was skipped): what a new selection may cost a
        # run once, before its first step
        "compile_ms": compile_ms,
        "calibration": _calibration_record(t_dw, t_dy, info.rank, t_fp, t_full, references),
        "calibration_skipped": skipped,
        "tensors": [
            {"name": flavors.tensor_name(v), "shape": [int(d) for d in v.shape], "t_dw_ms": t_dw[k],
             "t_dy_ms": t_dy[k], "estimated": estimated[k], "rank": info.rank[k]}
            for k, v in enumerate(variables)
        ],
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "processor": platform.machine(),
                 "tensorflow": tf.__version__,
                 "devices": [d.name for d in tf.config.list_logical_devices()]},
        "trace": trace,
        "profiling_wall_s": clock() - started,
        "profiling_phases_s": phases,
        "peak_rss_mb": peak_rss_mb(),
        "profiled_pid": os.getpid(),
    }


def _calibration_record(t_dw, t_dy, rank, t_fp, t_full, references):
    """The table's `calibration`: fitted scales and each timed reference's ratios; None when no
    reference was timed."""
    if not references:
        return None
    a, b, c = calibration.fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, references)
    uniform = uniform_scale(t_dw, t_dy, t_fp, t_full)

    def ratio(scale_dw, scale_dy, mask, fixed=0.0):
        dw, dy = selection_sums(t_dw, t_dy, rank, mask)
        return (t_fp + fixed + scale_dw * dw + scale_dy * dy) / t_full

    return {
        "dw_scale": a, "dy_scale": b, "fixed_ms": c, "uniform_scale": uniform,
        "references": [
            {"name": name, "selected": int(np.sum(mask)), "measured_ratio": r,
             "uniform_ratio": ratio(uniform, uniform, mask),
             "calibrated_ratio": ratio(a, b, mask, c)}
            for name, (mask, r) in references.items()],
    }
