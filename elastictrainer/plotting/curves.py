"""Fig. 15/16: accuracy and loss over wall-clock time, one curve per run."""
from collections import OrderedDict

import numpy as np

from elastictrainer import runlog
from elastictrainer.plotting.common import (_figure_legend, _group_flag, _legend_label, _series_mean, load_runs, pyplot, save_figure, scheme_styles, step_to_time, time_unit)


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
    handles = {}
    for (col, key), members in groups.items():
        j = columns.index(col)
        style, flag = styles[key], _group_flag(members)
        curves = [run_curves(r) for r in members]
        for i, name in enumerate(("accuracy", "loss")):
            t, mean, lo, hi = _series_mean([c[name] for c in curves])
            if len(t) == 0:
                continue
            ax = axes[i, j]
            line, = ax.plot(t / scale, mean, color=style.color, lw=1.6,
                            ls="--" if flag else "-", marker="o" if name == "accuracy" else None,
                            ms=3.5)
            if len(members) > 1:
                ax.fill_between(t / scale, lo, hi, color=style.color, alpha=0.18, lw=0)
            handles.setdefault((style.rank, flag or ""), (line, _legend_label(
                style, flag, [r for r in runs if r.key == key])))
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
    _figure_legend(fig, [handles[k] for k in sorted(handles)])
    return save_figure(fig, out)
