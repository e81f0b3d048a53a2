"""Fig. 17/19 and Fig. 23: accuracy, training time and energy as bars, seeds grouped."""
import sys
from collections import OrderedDict, namedtuple

import numpy as np

from elastictrainer.errors import UserError
from elastictrainer import runlog
from elastictrainer.plotting.common import (Style, _figure_legend, _group_flag, _legend_label, _order_key, load_runs, out_base, pyplot, save_figure, scheme_label, scheme_styles, time_unit)


# --------------------------------------------------------------------------- Fig. 17/19
BarGroup = namedtuple("BarGroup", "model dataset key runs accuracy time_s flag")


def bar_groups(runs, warn=None):
    """Runs grouped by (model, dataset, scheme and other settings), seeds together, in
    first-appearance order of (model, dataset) and legend order within.  Runs without a
    finished epoch are left out."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    by = OrderedDict()
    for r in runs:
        if not r.epochs or r.summary.get("best_test_accuracy") is None:
            warn(f"note: {r.path} has no finished epoch yet; left out")
            continue
        by.setdefault((r.model, r.dataset), OrderedDict()).setdefault(r.key, []).append(r)
    groups = []
    for (model, dataset), schemes in by.items():
        for key in sorted(schemes, key=_order_key):
            members = schemes[key]
            groups.append(BarGroup(model, dataset, key, members,
                                   np.array([r.summary["best_test_accuracy"] for r in members]),
                                   np.array([r.summary["train_time_s"] for r in members]),
                                   _group_flag(members)))
    if not groups:
        raise UserError("none of the runs has a finished epoch to plot")
    return groups


def speedups(groups):
    """Mean full_training time / mean time of each group, same model, dataset and other
    settings (None if no such full_training run); in the order of `groups`."""
    full = {(g.model, g.dataset, g.key.variant): g.time_s.mean() for g in groups
            if g.key.train_type == "full_training"}
    out = []
    for g in groups:
        ref = full.get((g.model, g.dataset, g.key.variant))
        out.append(ref / g.time_s.mean() if ref is not None and g.time_s.mean() > 0 else None)
    return out


def bars_table(groups):
    """Markdown table of the bar groups (mean over seeds), times in one readable unit."""
    scale, unit = time_unit(max(g.time_s.max() for g in groups))
    variants = any(g.key.variant for g in groups)
    rows = ["| model | dataset | scheme | rho |" + (" settings |" if variants else "") +
            f" seeds | best accuracy (%) | training time ({unit}) | speedup vs full |",
            "|---|---|---|---|" + ("---|" if variants else "") + "---|---|---|---|"]
    for g, s in zip(groups, speedups(groups)):
        label = _legend_label(Style(scheme_label(g.key.train_type), None, 0), g.flag)
        rho = "" if g.key.rho is None else runlog.rho_text(g.key.rho)
        setting = (" " + ", ".join(f"{k}={v}" for k, v in g.key.variant) + " |") if variants else ""
        speed = "" if s is None else f"{s:.2f}x"
        rows.append(f"| {g.model} | {g.dataset} | {label} | {rho} |{setting} "
                    f"{_seeds_cell(g.runs)} | {g.accuracy.mean():.2f} | "
                    f"{g.time_s.mean() / scale:.3g} | {speed} |")
    return "\n".join(rows) + "\n"


def _seeds_cell(runs):
    """The seeds a row averages, and its runs where a seed repeats (seeds_label)."""
    seeds = len({r.seed for r in runs})
    return str(seeds) if len(runs) <= seeds else f"{seeds} ({len(runs)} runs)"


Panel = namedtuple("Panel", "title ylabel values decimals")  # values: BarGroup -> array


def _bar_figure(groups, panels, out):
    """One panel per Panel, one bar per group (seeds averaged, min-max error bars), bars
    grouped by model (and dataset), one legend for all.  Returns the written paths."""
    plt = pyplot()
    styles = scheme_styles(g.key for g in groups)
    sites = list(OrderedDict.fromkeys((g.model, g.dataset) for g in groups))
    models = {m for m, _ in sites}
    datasets = {d for _, d in sites}

    def site_name(site):
        if len(models) > 1 and len(datasets) > 1:
            return f"{site[0]}\n{site[1]}"
        return site[0] if len(models) > 1 else site[1]

    per_site = {s: [g for g in groups if (g.model, g.dataset) == s] for s in sites}
    width = 0.8 / max(len(v) for v in per_site.values())
    nbars = len(groups)
    fig, axes = plt.subplots(1, len(panels), squeeze=False, layout="constrained",
                             figsize=(max(7.0, 1.2 + 0.55 * nbars * len(panels)), 3.9))
    handles = {}
    for ax, panel in zip(axes[0], panels):
        for x, site in enumerate(sites):
            members = per_site[site]
            for i, g in enumerate(members):
                vals = np.asarray(panel.values(g), float)
                pos = x + (i - (len(members) - 1) / 2) * width
                style = styles[g.key]
                err = None
                if len(vals) > 1:
                    err = [[vals.mean() - vals.min()], [vals.max() - vals.mean()]]
                bar = ax.bar(pos, vals.mean(), width * 0.92, color=style.color, yerr=err,
                             capsize=3, hatch="//" if g.flag else None,
                             edgecolor="white" if g.flag else None, lw=0)
                handles.setdefault((style.rank, g.flag or ""), (bar, _legend_label(
                    style, g.flag, [r for h in groups if h.key == g.key for r in h.runs])))
                if nbars <= 16:  # numbers help reading; they clutter a crowded panel
                    v = vals.mean()
                    # fixed decimals (accuracy to 0.1 point), else 2 significant digits under 10
                    if panel.decimals is None and v < 10:
                        text = f"{v:.2g}"
                    else:
                        text = f"{v:.{1 if panel.decimals is None else panel.decimals}f}"
                    ax.annotate(text, (pos, vals.max()), xytext=(0, 2),
                                textcoords="offset points", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(sites)))
        ax.set_xticklabels([site_name(s) for s in sites])
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.margins(y=0.12)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title)
    if len(models) == 1:
        fig.suptitle(next(iter(models)))
    _figure_legend(fig, [handles[k] for k in sorted(handles)])
    return save_figure(fig, out)


def plot_bars(run_dirs, out):
    """Best test accuracy and training time per scheme, bars grouped by model (and dataset),
    seeds averaged with min-max error bars; also writes <out>.md.  Returns (paths, markdown)."""
    groups = bar_groups(load_runs(run_dirs))
    scale, unit = time_unit(max(g.time_s.max() for g in groups))
    paths = _bar_figure(groups, [
        Panel("Best test accuracy", "best test accuracy (%)", lambda g: g.accuracy, 1),
        Panel("Wall-clock training time", f"training time ({unit})",
              lambda g: g.time_s / scale, None)], out)
    table = bars_table(groups)
    md = out_base(out) + ".md"
    with open(md, "w") as f:
        f.write(table)
    return paths + [md], table


def energy_of(group):
    """The measured training energy (J) of each run of a group; None if any run has none."""
    values = [r.summary.get("energy_j") for r in group.runs]
    return None if any(v is None for v in values) else np.array(values, float)


def plot_energy(run_dirs, out):
    """Paper Fig. 23: training energy and average power per scheme (and rho), from the runs'
    measured energy_j and avg_power_w; runs without a sensor reading are left out, saying why.
    Returns the written paths."""
    groups = bar_groups(load_runs(run_dirs))
    measured = [g for g in groups if energy_of(g) is not None]
    for g in groups:
        if energy_of(g) is None:
            sources = {r.summary.get("energy_source") or "not recorded" for r in g.runs}
            print(f"note: {scheme_label(*g.key)} on {g.model}/{g.dataset}: no energy measured "
                  f"({'; '.join(sorted(sources))}); left out", file=sys.stderr)
    if not measured:
        raise UserError("none of the runs measured energy (it needs a sensor: Jetson INA3221 "
                        "rails, Intel RAPL or NVML; see energy_source in their summary.json)")
    big = max(energy_of(g).max() for g in measured)
    scale, unit = (1000.0, "kJ") if big >= 10000 else (1.0, "J")
    return _bar_figure(measured, [
        Panel("Training energy", f"energy ({unit})", lambda g: energy_of(g) / scale, None),
        Panel("Average power", "power (W)",
              lambda g: np.array([r.summary["avg_power_w"] for r in g.runs], float), None)], out)
