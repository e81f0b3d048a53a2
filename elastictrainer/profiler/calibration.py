"""Calibration of the time model: time a few real partial selections and fit separate scales
for t_dw and t_dy (weight-gradient ops overlap the error-gradient chain on multi-core CPUs, so
summed op times misjudge selections that are mostly chain); and whether a run's first profiling
calibrates at all (worth_calibrating: only where it is a small share of the run)."""
import statistics
import time

import numpy as np

from elastictrainer.method.time_model import selection_sums, uniform_scale

# A negative fixed cost (fit_fixed_cost) may take at most this share off the timed forward pass:
# more would say the forward pass is nearly free, which no measurement here has shown (the
# largest seen took 23% off).
MIN_FORWARD_SHARE = 0.5
# Timed repeats stop early, after MIN_ROUNDS, once every series agrees with itself: its range
# within STEADY_SPREAD of its median.  The median of agreeing repeats moves little with more of
# them (MobileNetV2 at 96 px, batch 8: the reference ratios of the first 3 of 8 rounds were
# within 1.3% of all 8's), and on a loaded machine, where they disagree, every repeat is run.
MIN_ROUNDS, STEADY_SPREAD = 3, 0.08
# A --rho auto run's first profiling calibrates when the calibration would take at most this
# share of what the run's steps take at the full step's pace (the economy's share for
# re-selecting): it compiles a step per reference selection, which on Keras' MobileNetV2 in
# model.fit (158 tensors, 64 px) took 24 s of a 50 s profiling on 2 cores, before a fit of 80 s.
# auto promises no step ratio, and its closed loop corrects the time model from the steps it
# times.  A numeric rho is a ratio the run promises, so its first profiling always calibrates
# (that model at rho 0.3 measured 0.38 uncalibrated, 0.32 calibrated); so does profiler.py.
CALIBRATION_SHARE = 0.1


def first_profiling_steps(auto, feedback, run_steps):
    """The steps a run's first profiling is told (profile_model's run_steps), so that it
    calibrates only when they pay for it: a --rho auto run's (`auto`) with its closed loop on
    (`feedback`); None, so that it calibrates whatever the run's length, for a numeric rho or
    with the closed loop off."""
    return run_steps if auto and feedback else None


def recalibrate_reason(table, run_steps):
    """Why a run that found `table` profiles again before using it, in a few words; None when
    it may use it.  A --rho auto run's first profiling may have skipped calibration
    (calibration_skipped); a run told no steps (`run_steps` None: a numeric rho, or the closed
    loop off: first_profiling_steps) promises a step ratio, and an uncalibrated time model
    misjudges it (rho 0.3 measured 0.38 uncalibrated, 0.32 calibrated)."""
    skipped = table.get("calibration_skipped")
    if skipped and run_steps is None:
        return (f"its first profiling skipped calibration ({skipped}), which a numeric rho "
                f"or --rho_feedback false needs")
    return None


def calibration_estimate_s(compile_s, t_full_s, n_refs, rounds=MIN_ROUNDS):
    """Seconds calibrating takes at least (time_reference_selections): each reference
    selection's step compiled (`compile_s`, as the probe step's compile took) and called twice,
    then `rounds` rounds of every step and the full one twice each, none dearer than a full
    step."""
    return n_refs * (compile_s + 2 * t_full_s) + rounds * (n_refs + 1) * 2 * t_full_s


def worth_calibrating(estimate_s, t_full_s, run_steps, share=CALIBRATION_SHARE):
    """Whether a run of `run_steps` steps calibrates its first profiling: the calibration's
    `estimate_s` within `share` of those steps at the full step's pace `t_full_s`."""
    return estimate_s <= share * run_steps * t_full_s


def settled(series, min_rounds=MIN_ROUNDS, spread=STEADY_SPREAD):
    """Whether timed repeats may stop: each of `series` (lists of timings or ratios, one entry
    per round so far) has at least `min_rounds` entries and spans at most `spread` of its
    median."""
    for values in series:
        if len(values) < min_rounds:
            return False
        mid = statistics.median(values)
        if not mid > 0 or (max(values) - min(values)) > spread * mid:
            return False
    return True


def reference_selections(rank):
    """Selections timed to calibrate the time model, as {name: mask}: the output-most tensor
    alone (the floor of every selection), the error gradient alone down to the input and down
    to half depth (one tensor trained), and everything in the output-most half.  With the full
    step they pull t_dw's and t_dy's scales apart and give the fixed cost (fit_fixed_cost)."""
    rank = np.asarray(rank)
    n = len(rank)
    half = max(0, (n - 1) // 2)
    refs = {
        "output_only": rank == 0,
        "dy_to_input": rank == n - 1,
        "dy_to_half": rank == half,
        "all_to_half": rank <= half,
    }
    return {k: m for k, m in refs.items() if m.any()}


def fit_calibration(t_dw, t_dy, rank, t_fp, t_full, measured):
    """Separate scales for the dw and dy op times, fitted to measured step-time ratios.

    Summed op times overstate the backward pass whenever ops run concurrently: weight-gradient
    ops hang off the error-gradient chain and overlap with it, so they cost less wall time than
    their op time, and the chain itself more.  One uniform scale then under-predicts selections
    that are mostly chain (deep, few tensors).  We fit  ratio = (t_fp + a*DW + b*DY) / t_full
    by least squares over `measured` ({name: (mask, ratio)}), constrained so that the full
    selection still predicts exactly t_full, with a, b >= 0.  Returns (a, b).
    """
    t_dw, t_dy = np.asarray(t_dw, float), np.asarray(t_dy, float)
    dw_all, dy_all = t_dw.sum(), t_dy.sum()
    budget = t_full - t_fp
    uniform = uniform_scale(t_dw, t_dy, t_fp, t_full)
    if dw_all <= 0 or dy_all <= 0 or budget <= 0 or not measured:
        return uniform, uniform
    # b = (budget - a*dw_all)/dy_all; the residual is linear in a
    num = den = 0.0
    for mask, ratio in measured.values():
        dw, dy = selection_sums(t_dw, t_dy, rank, mask)
        u = dw - dw_all * dy / dy_all
        target = ratio * t_full - t_fp - budget * dy / dy_all
        num += u * target
        den += u * u
    if den <= 0:
        return uniform, uniform
    a = min(max(num / den, 0.0), budget / dw_all)
    # at a's upper bound, budget - a * dw_all rounds to about -1e-16: b is 0 then, not below
    return a, max((budget - a * dw_all) / dy_all, 0.0)


def fit_fixed_cost(t_dw, t_dy, rank, t_fp, t_full, measured):
    """Like fit_calibration, plus a fixed cost c (ms) that every partial step pays beyond the
    profiled forward pass: ratio = (t_fp + c + a*DW + b*DY) / t_full, the full selection still
    predicting exactly t_full.  Returns (a, b, c).

    Why: at small inputs a partial step costs more than its ops (dispatch, Python, a less
    parallel backward on few cores): smallcnn at 64 px, batch 32, measured 0.36 / 0.41 / 0.47 /
    0.59 of a full step for its 2 / 5 / 8 / 11 output-most tensors where the scales alone
    predicted 0.30 / 0.34 / 0.40 / 0.49, an offset, not a slope.  The offset can also be
    negative: the forward pass timed on its own can cost more than inside a training step (the
    32-48-64 smallcnn on a 2-core AVX-512 machine: forward alone 0.40-0.43 of a full step, the
    head-only step 0.35-0.37), and with c held at 0 the time model put its floor at 0.43 and
    priced tensors 12-19 at 0.59 of a full step where they measured 0.46.  Least squares over
    (a, c), with b following from the constraint; c may be negative as long as the forward
    pass it leaves (t_fp + c) stays above MIN_FORWARD_SHARE of it; when the fit breaks that or
    gives a negative scale, c = 0 and (a, b) are fit_calibration's.
    """
    t_dw, t_dy = np.asarray(t_dw, float), np.asarray(t_dy, float)
    dw_all, dy_all = t_dw.sum(), t_dy.sum()
    budget = t_full - t_fp
    a0, b0 = fit_calibration(t_dw, t_dy, rank, t_fp, t_full, measured)
    if dw_all <= 0 or dy_all <= 0 or budget <= 0 or len(measured) < 2:
        return a0, b0, 0.0
    # t_fp + c + a*dw + b*dy = ratio*t_full, b = (budget - c - a*dw_all)/dy_all:
    #   a*(dw - dw_all*dy/dy_all) + c*(1 - dy/dy_all) = ratio*t_full - t_fp - budget*dy/dy_all
    rows, target = [], []
    for mask, ratio in measured.values():
        dw, dy = selection_sums(t_dw, t_dy, rank, mask)
        rows.append([dw - dw_all * dy / dy_all, 1.0 - dy / dy_all])
        target.append(ratio * t_full - t_fp - budget * dy / dy_all)
    (a, c), *_ = np.linalg.lstsq(np.array(rows), np.array(target), rcond=None)
    b = (budget - c - a * dw_all) / dy_all
    if (not (np.isfinite(a) and np.isfinite(c)) or abs(c) <= 1e-9 * t_full or a < 0 or b < 0
            or t_fp + c < MIN_FORWARD_SHARE * t_fp):
        return a0, b0, 0.0
    return float(a), float(b), float(c)


def time_reference_selections(model, optimizer, loss_fn, variables, full_step, rank, x, y,
                               rounds, bar, clock=time.perf_counter, min_rounds=MIN_ROUNDS):
    """Median step time of each reference selection over the full step's, interleaved, as
    {name: (mask, ratio)}; and the longest time compiling a reference selection's step took
    (its first call beyond its second), in ms: what a run may pay for a new selection.  The
    longest, since a compile grows with the selection's backward graph and a run compiles while
    its input pipeline shares the cores (MobileNetV2 at 224 px: the references 0.7-1.5 s here,
    a 32-tensor selection 1.1 s alone and 1.55 s inside a run), and the economy's promise that
    a short run is not slower than full training rests on it.  `clock`: seconds
    (profile_model's).  At most `rounds` rounds, fewer once the ratios have `settled` after
    `min_rounds`."""
    from elastictrainer.train import steps as train_steps

    refs = reference_selections(rank)
    steps = {"full": full_step}
    compile_s = []
    for name, mask in refs.items():
        steps[name] = train_steps.make_train_step(
            model, optimizer, loss_fn, [v for v, m in zip(variables, mask) if m])
        first = []
        for _ in range(2):  # the first call traces and compiles
            t0 = clock()
            steps[name](x, y)[0].numpy()
            first.append(clock() - t0)
        compile_s.append(max(first[0] - first[1], 0.0))
        bar.update(1)
    ratios = {name: [] for name in refs}
    for r in range(rounds):
        names = list(steps) if r % 2 == 0 else list(steps)[::-1]  # drift hits all alike
        times = {}
        for name in names:
            t = []
            for _ in range(2):
                t0 = clock()
                steps[name](x, y)[0].numpy()
                t.append(clock() - t0)
            times[name] = min(t)
        for name in refs:  # ratios within a round, so load that comes and goes cancels out
            ratios[name].append(times[name] / times["full"])
        bar.update(1)
        if settled(ratios.values(), min_rounds):
            break
    return ({name: (mask, statistics.median(ratios[name])) for name, mask in refs.items()},
            max(compile_s) * 1e3 if compile_s else None)
