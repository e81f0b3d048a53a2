"""Fig. 15/16 (and Fig. 17's curves): accuracy and loss over wall-clock time, one curve per
scheme, with marks where each scheme's accuracy first reaches the levels peers report time to
(time_to_accuracy.py's: 95% and 99% of full training's best, within 1 point of it)."""
from collections import OrderedDict

import numpy as np

from elastictrainer import runlog
from elastictrainer.plotting.common import (SchemeKey, _figure_legend, _group_flag, _legend_label, _series_mean, load_runs, pyplot, save_figure, scheme_styles, step_to_time, time_unit)
from elastictrainer.plotting.time_to_accuracy import LEVELS, NEVER, time_to

# A level's mark: hollow, in the scheme's colour, one shape per level (time_to_accuracy.LEVELS)
LEVEL_MARKS = {"p95": ("v", 8.0), "p99": ("D", 6.5), "pt1": ("*", 11.0)}


# --------------------------------------------------------------------------- Fig. 15/16
def run_curves(run):
    """{'accuracy': {step: (time s, test accuracy %)}, 'loss': {step: (time s, train loss)}}.

    Test accuracy from TEST_ACCURACY events (summary.json's epochs if a run has none), training
    loss from TRAIN_LOSS events; steps are mapped to training time with step_to_time.
    """
    spe = run.summary["steps_per_epoch"]
    steps, acc = run.scalars(runlog.TEST_ACCURACY)
    if len(steps) == 0:
        steps = np.array([e["epoch"] * spe for e in run.epochs])
        acc = np.array([e["test_accuracy"] for e in run.epochs])
    lsteps, loss = run.scalars(runlog.TRAIN_LOSS)
    out = {}
    for name, s, v in (("accuracy", steps, acc), ("loss", lsteps, loss)):
        t = step_to_time(s, spe, run.epochs)
        out[name] = {int(k): (ti, vi) for k, ti, vi in zip(s, t, v) if np.isfinite(ti)}
    return out


def plot_curves(run_dirs, out):
    """Test accuracy and training loss vs training time: one column per dataset (per model and
    dataset when the runs span several models), one line per scheme; seeds are averaged with a
    min-max band.  Returns the written paths."""
    runs = load_runs(run_dirs)
    plt = pyplot()
    models = list(OrderedDict.fromkeys(r.model for r in runs))
    if len(models) == 1:
        def column_of(r):
            return r.dataset
    else:
        def column_of(r):
            return f"{r.model} · {r.dataset}"
    columns = list(OrderedDict.fromkeys(column_of(r) for r in runs))
    styles = scheme_styles(r.key for r in runs)
    groups = OrderedDict()  # (column, scheme) -> runs (seeds)
    for r in runs:
        groups.setdefault((column_of(r), r.key), []).append(r)
    max_time = max([r.summary.get("train_time_s") or 0.0 for r in runs] +
                   [r.epochs[-1]["train_time_s"] for r in runs if r.epochs])
    scale, unit = time_unit(max_time)

    fig, axes = plt.subplots(2, len(columns), figsize=(max(5.0, 4.2 * len(columns)), 6.4),
                             sharex="col", squeeze=False, layout="constrained")
    handles, accuracy = {}, {}
    for (col, key), members in groups.items():
        j = columns.index(col)
        style, flag = styles[key], _group_flag(members)
        curves = [run_curves(r) for r in members]
        for i, name in enumerate(("accuracy", "loss")):
            t, mean, lo, hi = _series_mean([c[name] for c in curves])
            if len(t) == 0:
                continue
            ax = axes[i, j]
            if name == "accuracy":
                accuracy[col, key] = (list(zip(t, mean)), style)
            line, = ax.plot(t / scale, mean, color=style.color, lw=1.6,
                            ls="--" if flag else "-", marker="o" if name == "accuracy" else None,
                            ms=3.5)
            if len(members) > 1:
                ax.fill_between(t / scale, lo, hi, color=style.color, alpha=0.18, lw=0)
            handles.setdefault((style.rank, flag or ""), (line, _legend_label(
                style, flag, [r for r in runs if r.key == key])))
    marked = False
    for (col, key), (series, style) in accuracy.items():
        full = accuracy.get((col, SchemeKey("full_training", None, key.variant)))
        if full is None:  # no yardstick in this panel
            continue
        for level, (t, acc) in level_marks(series, full[0]).items():
            shape, size = LEVEL_MARKS[level]
            axes[0, columns.index(col)].plot(
                [t / scale], [acc], ls="none", marker=shape, ms=size, mfc="none",
                mec=style.color, mew=1.3, zorder=3, gid=f"{level}|{style.label}")
            marked = True
    for j, col in enumerate(columns):
        axes[0, j].set_title(col)
        axes[1, j].set_xlabel(f"training time ({unit})")
        for i in range(2):
            axes[i, j].grid(alpha=0.3)
            axes[i, j].set_xlim(left=0)
    axes[0, 0].set_ylabel("test accuracy (%)")
    axes[1, 0].set_ylabel("training loss")
    if len(models) == 1:
        fig.suptitle(f"{models[0]}: training curves")
    entries = [handles[k] for k in sorted(handles)]
    if marked:
        entries += [(plt.Line2D([], [], ls="none", marker=LEVEL_MARKS[key][0], mfc="none",
                                mec="0.3", mew=1.3, ms=LEVEL_MARKS[key][1]), f"first at {label}")
                    for key, label, _ in LEVELS]
    _figure_legend(fig, entries)
    return save_figure(fig, out)


def level_marks(series, reference):
    """{level key: (time, accuracy)}: the first point of `series` ([(time, accuracy)]) at or
    above each of LEVELS, set by the best accuracy of `reference` (full training's series); a
    level the series never reaches has no mark."""
    best = max(a for _, a in reference)
    marks = {}
    for key, _, level_of in LEVELS:
        t = time_to(series, level_of(best))
        if t is not NEVER:
            marks[key] = next((ti, a) for ti, a in series if ti == t)
    return marks
