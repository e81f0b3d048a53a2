"""A timing table in a few human-readable lines: what `profiler.py` prints about the table it
made or found, and what a run that profiles first logs."""

# A calibration whose fitted ratios miss a timed reference by more than this was likely made on a
# busy machine (measured here: 1.2-4.1% idle, 11% while the test suite ran).
NOISY_CALIBRATION = 0.10


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
        f"backward op time attributed to tensors: {100 * table['coverage']:.1f}%"
        + (f"; compiling a selection's step {table['compile_ms']:.0f} ms"
           if table.get("compile_ms") is not None else ""),
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
    elif table.get("calibration_skipped"):
        lines.append(f"time model not calibrated: {table['calibration_skipped']}; the run's "
                     f"closed loop corrects it from the steps it times (profiler.py, run first, "
                     f"calibrates)")
    else:
        lines.append("time model not calibrated (one uniform scale for t_dw and t_dy)")
    if table["unattributed"]:
        top = ", ".join(f"{u['name']} {u['ms']:.2f} ms" for u in table["unattributed"][:3])
        lines.append(f"top unattributed: {top}")
    return "\n".join(lines)
