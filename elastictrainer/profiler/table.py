"""The timing table: where it lives, its format, its validation and its summary.

No TensorFlow: training, plotting and the figure driver read tables without starting it.
"""
import json
import math
import os

from elastictrainer import runlog
from elastictrainer.common import UserError

TABLE_VERSION = 1
# A calibration whose fitted ratios miss a timed reference by more than this was likely made on a
# busy machine (measured here: 1.2-4.1% idle, 11% while the test suite ran).
NOISY_CALIBRATION = 0.10
PROFILE_DIR = "profiles"
REQUIRED_KEYS = ("model", "input_size", "batch_size", "num_classes", "t_fp_ms", "t_bp_ms",
                 "t_full_ms", "coverage", "unattributed", "tensors")
# Tables written before the profiler took the run's optimizer were all profiled with SGD.
DEFAULT_OPTIMIZER = "sgd"


def default_table_path(model_name, input_size, batch_size, num_classes,
                       optimizer=DEFAULT_OPTIMIZER, folder=PROFILE_DIR):
    """Where the profiler writes, and training looks for, a model configuration's table.

    SGD tables keep the reference's name (<model>_i<input>_b<batch>_c<classes>.json); another
    optimizer's update ops cost differently, so its table gets its own name (..._adam.json).
    """
    stem = os.path.splitext(os.path.basename(str(model_name)))[0]
    suffix = "" if optimizer == DEFAULT_OPTIMIZER else f"_{optimizer}"
    return os.path.join(folder, f"{stem}_i{input_size}_b{batch_size}_c{num_classes}{suffix}.json")


def save_table(table, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    runlog.write_json(path, table)  # a table is either whole or absent, even if interrupted


def table_optimizer(table):
    return table.get("optimizer", DEFAULT_OPTIMIZER)


def load_table(path, model=None, input_size=None, batch_size=None, optimizer=None):
    """Read a timing table; reject a corrupt file or one made for another configuration."""
    if not os.path.exists(path):
        raise UserError(f"no timing table at {path}; run profiler.py first")
    try:
        with open(path) as f:
            table = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"corrupt timing table {path}: {e}") from None
    if not isinstance(table, dict):
        raise UserError(f"corrupt timing table {path}: not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in table]
    if missing:
        raise UserError(f"corrupt timing table {path}: missing {', '.join(missing)}")
    try:
        t_fp, t_full = float(table["t_fp_ms"]), float(table["t_full_ms"])
        if not (math.isfinite(t_fp) and math.isfinite(t_full) and 0 <= t_fp < t_full):
            raise ValueError(f"need 0 <= t_fp_ms < t_full_ms, finite; got t_fp_ms {t_fp}, "
                             f"t_full_ms {t_full}")
    except (TypeError, ValueError) as e:
        raise UserError(f"corrupt timing table {path}: {e}") from None
    try:
        for k, t in enumerate(table["tensors"]):
            for key in ("name", "t_dw_ms", "t_dy_ms"):
                t[key]
            for key in ("t_dw_ms", "t_dy_ms"):
                if not (math.isfinite(t[key]) and t[key] >= 0):
                    raise ValueError(f"tensor {k} has {key} {t[key]}; times must be finite "
                                     "and >= 0")
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"corrupt timing table {path}: bad tensor entry ({e})") from None
    grads = table.get("t_grads_ms")  # tables before it have none
    if grads is not None and not (isinstance(grads, (int, float)) and math.isfinite(grads)
                                  and grads > 0):
        raise UserError(f"corrupt timing table {path}: t_grads_ms {grads} must be positive")
    cal = table.get("calibration")
    if cal is not None:
        try:
            if not all(math.isfinite(cal[k]) and cal[k] >= 0 for k in ("dw_scale", "dy_scale")):
                raise ValueError("scales must be finite and >= 0")
            fixed = cal.get("fixed_ms", 0.0)  # tables before the fixed cost have none
            # negative: the forward pass costs less inside a step than timed alone
            if not (math.isfinite(fixed) and -table["t_fp_ms"] < fixed < table["t_full_ms"]):
                raise ValueError(f"fixed_ms {fixed} is not in (-t_fp_ms, t_full_ms)")
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"corrupt timing table {path}: bad calibration ({e})") from None
    if input_size is not None and table["input_size"] != input_size:
        raise UserError(f"timing table {path} was profiled at input size {table['input_size']}, "
                        f"not {input_size}; re-run profiler.py")
    if batch_size is not None and table["batch_size"] != batch_size:
        raise UserError(f"timing table {path} was profiled at batch size {table['batch_size']}, "
                        f"not {batch_size}; re-run profiler.py")
    if optimizer is not None and table_optimizer(table) != optimizer:
        raise UserError(f"timing table {path} was profiled with --optimizer "
                        f"{table_optimizer(table)}, not {optimizer}, whose updates cost "
                        f"differently; re-run profiler.py --optimizer {optimizer}, or pass "
                        f"another --timing_table")
    if model is not None:
        names = [v.name for v in model.trainable_weights]
        got = [t["name"] for t in table["tensors"]]
        if len(names) != len(got):
            raise UserError(f"timing table {path} has {len(got)} tensors but the model has "
                            f"{len(names)}; re-run profiler.py for this model")
        if names != got:
            first = next(i for i, (a, b) in enumerate(zip(names, got)) if a != b)
            raise UserError(f"timing table {path} does not match the model: tensor {first} is "
                            f"{got[first]!r} in the table, {names[first]!r} in the model")
    return table


def summarize(table):
    """One human-readable block about a table."""
    n = len(table["tensors"])
    est = sum(t["estimated"] for t in table["tensors"])
    lines = [
        f"model {table['model']}  input {table['input_size']}  batch {table['batch_size']}  "
        f"classes {table['num_classes']}  tensors {n} ({est} estimated)",
        f"forward {table['t_fp_ms']:.1f} ms  backward {table['t_bp_ms']:.1f} ms  "
        f"full step {table['t_full_ms']:.1f} ms  (t_fp/t_full {table['t_fp_ms'] / table['t_full_ms']:.2f})"
        + (f"  without the update {table['t_grads_ms']:.1f} ms" if table.get("t_grads_ms") else ""),
        f"backward op time attributed to tensors: {100 * table['coverage']:.1f}%",
    ]
    if table.get("timing_note"):
        lines.append(f"note: {table['timing_note']}; profile again on a quiet machine")
    cal = table.get("calibration")
    if cal:
        worst = max((abs(r["calibrated_ratio"] / r["measured_ratio"] - 1) for r in cal["references"]),
                    default=0.0)
        fixed = cal.get("fixed_ms", 0.0)
        why = "(the forward pass costs less in a step than timed alone) " if fixed < 0 else ""
        lines.append(f"time model calibrated on {len(cal['references'])} timed selections: "
                     f"t_dw x{cal['dw_scale'] / cal['uniform_scale']:.2f}, "
                     f"t_dy x{cal['dy_scale'] / cal['uniform_scale']:.2f} of the uniform scale, "
                     f"fixed cost {fixed:+.2f} ms a partial step {why}"
                     f"(worst reference error {100 * worst:.1f}%)")
        if worst > NOISY_CALIBRATION:
            lines.append("the timed selections disagree with the fit by more than "
                         f"{100 * NOISY_CALIBRATION:.0f}%: if the machine was busy, profile again "
                         "when it is idle")
    else:
        lines.append("time model not calibrated (one uniform scale for t_dw and t_dy)")
    if table["unattributed"]:
        top = ", ".join(f"{u['name']} {u['ms']:.2f} ms" for u in table["unattributed"][:3])
        lines.append(f"top unattributed: {top}")
    return "\n".join(lines)
