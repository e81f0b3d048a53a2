"""Accuracy against wall clock, with the levels peers report time to (PieBridge, Cache &
Reuse): 95% and 99% of full training's best accuracy, and within 1 point of it.  One line per
scheme; drawn from curves (scripts/bench_time_to_accuracy.py) or from run directories
(`plot.py time`, whose full_training run sets the levels; without one, none are drawn)."""
import os

from elastictrainer.errors import UserError
from elastictrainer.plotting.common import (load_runs, pyplot, save_figure, scheme_label,
                                             time_unit)

# (key, label, the level given full training's best accuracy in %)
LEVELS = (
    ("p95", "95% of full's best", lambda best: 0.95 * best),
    ("p99", "99% of full's best", lambda best: 0.99 * best),
    ("pt1", "within 1 point", lambda best: best - 1.0),
)
NEVER = None


def time_to(points, level):
    """The first time `points` (a curve) reaches `level`, or NEVER."""
    for seconds, accuracy in points:
        if accuracy >= level:
            return seconds
    return NEVER


def curve(summary, offset_s=0.0):
    """[(seconds, test accuracy %)] after each tested epoch of a summary.json dict; seconds
    are the run's training time so far plus `offset_s` (what it paid before training)."""
    return [(offset_s + e["train_time_s"], e["test_accuracy"]) for e in summary["epochs"]
            if e.get("test_accuracy") is not None]


def draw(curves, out, reference_best=None, title="", levels=True):
    """{label: curve} as one figure at `out` (.png and .pdf); the levels as dashed lines, of
    `reference_best` (full training's best accuracy) when given, else of the first curve's best
    (the benchmark's curves start with full training's); none with `levels` false (no full
    training run to set them).  The axis holds every curve, one above the levels included."""
    plt = pyplot()
    # a run that was refused has a reason (a string) in place of its curve: nothing to draw
    curves = {k: v for k, v in curves.items() if not isinstance(v, str) and v}
    if not curves:
        raise UserError("nothing to draw: no curves")
    if reference_best is None and levels:
        reference_best = max(a for _, a in next(iter(curves.values())))
    accuracies = [a for c in curves.values() for _, a in c]
    longest = max(c[-1][0] for c in curves.values())
    scale, unit = time_unit(longest)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    # the default cycle has 10 colours: a benchmark's dozen schemes would share them
    palette = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    for k, (label, points) in enumerate(curves.items()):
        ax.plot([t / scale for t, _ in points], [a for _, a in points], marker="o", ms=3,
                lw=1.4, label=label, color=palette(k % palette.N))
    for k, (_, name, level_of) in enumerate(LEVELS if levels else ()):
        level = level_of(reference_best)
        ax.axhline(level, color="0.5", lw=0.8, ls="--")
        # 99% and within 1 point are often a fraction of a point apart: labels on both sides
        side = k % 2
        ax.annotate(name, (side, level), xycoords=("axes fraction", "data"),
                    xytext=(-2 if side else 2, 2), textcoords="offset points", fontsize=7,
                    color="0.35", ha="right" if side else "left")
    lowest = min(accuracies + ([LEVELS[0][2](reference_best)] if levels else []))
    highest = max(accuracies + ([reference_best] if levels else []))
    ax.set_ylim(max(lowest - 2, 0.0), min(highest + 3, 101.0))
    ax.set_xlim(left=0)
    ax.set_xlabel(f"wall clock ({unit}, profiling included)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.set_title(title or "test accuracy against wall clock")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return save_figure(fig, out)


def plot_time_to_accuracy(run_dirs, out):
    """`plot.py time`: one line per run directory, the levels from its full_training run.  An
    elastic run's line starts after the profiling it paid (summary.json's profiling_s, added
    where its training time does not already hold it), as the axis says."""
    runs = load_runs(run_dirs)
    seeds = len({r.seed for r in runs}) > 1
    labels = [scheme_label(r.train_type, r.rho, r.variant) + (f", seed {r.seed}" if seeds
                                                               else "") for r in runs]
    # runs alike in every setting but their directory: each is named by it, as given
    alike = {label for label in labels if labels.count(label) > 1}
    names = [os.path.basename(r.path) for r in runs]
    curves = {}
    for r, label, name in zip(runs, labels, names):
        if label in alike:
            label += f" ({name if names.count(name) == 1 else r.path})"
        curves[label] = curve(r.summary, offset_s=profiling_offset(r.summary))
    full = [r for r in runs if r.train_type == "full_training"]
    best = max((a for r in full for _, a in curve(r.summary)), default=None)
    return draw(curves, out, reference_best=best, levels=best is not None,
                title="" if best is not None else
                "test accuracy against wall clock (no full_training run: no levels)")


def profiling_offset(summary):
    """The seconds of profiling a run paid outside its training time (0 when it read its
    table, or when its training time holds them: model.fit profiles on its first batch; 0 too
    for a summary that does not say where they went, as the run recorded it)."""
    if summary.get("profiling_in_train_time") is not False:
        return 0.0
    return float(summary.get("profiling_s") or 0.0)
