"""The paper's figures from run directories written by the training loop (CLI: `plot`).

Everything is read from summary.json and the TensorBoard events (runlog.read_scalars /
read_tensors), never from stdout.  Each figure is written as <out>.png and <out>.pdf.
"""
import os
import sys
from collections import OrderedDict, namedtuple

import numpy as np

from elastictrainer import runlog
from elastictrainer.common import UserError
from elastictrainer.schemes import SCHEMES

# --------------------------------------------------------------------------- schemes and styles
# A baseline has one fixed colour; an elastic scheme has a (light, dark) pair and its runs get
# shades in between, ordered by rho (schemes.py carries both).  Legend order: elastic schemes (by
# rho) first, then the baselines in registration order, as in the paper's figures.
_SPARE_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#8c564b", "#000000")  # unknown train_types

# rho None for non-elastic runs; variant: the (setting, value) pairs in which the runs drawn
# together differ (see load_runs), so that runs with other settings are never averaged together.
SchemeKey = namedtuple("SchemeKey", "train_type rho variant", defaults=((),))
# config.json settings that do not change what a run computes (or are told apart otherwise:
# model and dataset by panel, train_type and rho by the scheme); every other setting tells runs
# apart.
NOT_A_VARIANT = {"seed", "run_name", "logdir", "progress", "timing_table", "data_dir",
                 "save_model", "save_txt", "energy", "model_name", "dataset_name", "train_type",
                 "rho"}
Style = namedtuple("Style", "label color rank")

# summary["status"] -> legend flag; "finished" has none.
STATUS_FLAGS = {"running": "unfinished", "interrupted": "unfinished", "nan": "diverged",
                "failed": "failed"}


def scheme_label(train_type, rho=None, variant=()):
    """'ElasticTrainer (ρ=0.4)', 'Full training', 'Full training, learning_rate=0.003', ...;
    an unknown train_type is shown as is."""
    base = SCHEMES[train_type].label if train_type in SCHEMES else train_type
    label = f"{base} (ρ={rho:g})" if rho is not None else base
    return ", ".join([label] + [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in variant])


def _mix(light, dark, t):
    a = np.array([int(light[i:i + 2], 16) for i in (1, 3, 5)], float)
    b = np.array([int(dark[i:i + 2], 16) for i in (1, 3, 5)], float)
    return "#" + "".join(f"{int(round(v)):02x}" for v in a + (b - a) * t)


def scheme_styles(keys):
    """SchemeKey -> Style(label, color, rank) for all the schemes drawn in one figure.

    Computed over the whole figure so a scheme has the same color in every panel; elastic runs
    with different rho, and runs of one scheme with other settings, get shades of their
    scheme's hue (lighter to darker as rho grows).
    """
    keys = sorted(set(keys), key=_order_key)
    styles = {}
    spare = iter(_SPARE_COLORS * 10)
    for train_type in OrderedDict.fromkeys(k.train_type for k in keys):
        mine = [k for k in keys if k.train_type == train_type]
        color = SCHEMES[train_type].color if train_type in SCHEMES else None
        for i, k in enumerate(mine):
            if isinstance(color, tuple):
                t = 1.0 if len(mine) == 1 else 0.3 + 0.7 * i / (len(mine) - 1)
                c = _mix(color[0], color[1], t)
            else:
                c = color or next(spare)
                if len(mine) > 1:  # variants of one baseline: from a light tint to its colour
                    t = 0.35 + 0.65 * i / (len(mine) - 1)
                    c = _mix(_mix(c, "#ffffff", 0.75), c, t)
            styles[k] = Style(scheme_label(*k), c, _order_key(k))
    return styles


def _order_key(key):
    names = sorted(SCHEMES, key=lambda n: not SCHEMES[n].elastic)  # stable: elastic first
    rank = names.index(key.train_type) if key.train_type in names else len(names)
    return (rank, key.train_type, -1.0 if key.rho is None else key.rho, repr(key.variant))


# --------------------------------------------------------------------------- runs
class Run:
    """One run directory: its summary.json, config.json (if any) and, lazily, its events."""

    def __init__(self, path):
        self.path = os.path.normpath(str(path))
        if not os.path.isdir(self.path):
            raise UserError(f"{path}: no such run directory")
        if not os.path.isfile(os.path.join(self.path, runlog.SUMMARY_FILE)):
            raise UserError(f"{path}: no {runlog.SUMMARY_FILE}, so not a run directory "
                            f"written by main.py")
        self.summary = _read_json(self.path, runlog.read_summary, runlog.SUMMARY_FILE)
        missing = [k for k in ("train_type", "model", "dataset", "steps_per_epoch", "epochs")
                   if k not in self.summary]
        if missing:
            raise UserError(f"{path}: {runlog.SUMMARY_FILE} lacks {', '.join(missing)}")
        self.config = {}
        if os.path.isfile(os.path.join(self.path, runlog.CONFIG_FILE)):
            self.config = _read_json(self.path, runlog.read_config, runlog.CONFIG_FILE)
        self._events = None

    train_type = property(lambda self: self.summary["train_type"])
    rho = property(lambda self: self.summary.get("rho"))
    seed = property(lambda self: self.config.get("seed", self.summary.get("seed")))
    variant = ()  # set by load_runs for the runs drawn together
    key = property(lambda self: SchemeKey(self.train_type, self.rho, self.variant))

    def settings(self):
        """The settings that change what this run computes (config.json, NOT_A_VARIANT out)."""
        return {k: v for k, v in self.config.items() if k not in NOT_A_VARIANT}
    model = property(lambda self: _display_name(self.summary["model"]))
    dataset = property(lambda self: _display_name(self.summary["dataset"]))
    epochs = property(lambda self: self.summary["epochs"])
    status = property(lambda self: self.summary.get("status", "finished"))
    flag = property(lambda self: STATUS_FLAGS.get(self.status))

    @property
    def events(self):
        if self._events is None:
            self._events = runlog.open_events(self.path)
        return self._events

    def scalars(self, tag):
        return runlog.read_scalars(self.path, tag, self.events)


def _read_json(path, reader, filename):
    try:
        obj = reader(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: corrupt {filename} ({e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: corrupt {filename} (not a JSON object)")
    return obj


def _display_name(name):
    """'resnet50' stays; a model file or dataset folder path becomes its base name."""
    base = os.path.basename(os.path.normpath(str(name)))
    stem, ext = os.path.splitext(base)
    return stem if ext in (".keras", ".h5") else base


def find_run_dirs(path):
    """`path` if it is a run directory, else every run directory below it (sorted)."""
    path = str(path)
    if os.path.isfile(os.path.join(path, runlog.SUMMARY_FILE)) or not os.path.isdir(path):
        return [path]  # Run() says what is wrong with a path that is not a run directory
    found = sorted(root for root, _, files in os.walk(path) if runlog.SUMMARY_FILE in files)
    if not found:
        raise UserError(f"{path}: no {runlog.SUMMARY_FILE} in it or below it, so no run "
                        f"directory written by training")
    return found


def load_runs(paths, warn=None):
    """Run objects for the given run directories, or directories holding them (duplicates
    dropped); UserError on bad input.

    Runs that differ in any setting but the seed (config.json) are never averaged together:
    each run's `variant` lists its values of the settings that differ among `paths`, which
    tells their groups apart in legends and tables, and `warn` says which settings differ.
    """
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    if not paths:
        raise UserError("give at least one run directory (a folder with summary.json)")
    runs, seen = [], set()
    for p in paths:
        for d in find_run_dirs(p):
            real = os.path.realpath(d)
            if real not in seen:
                seen.add(real)
                runs.append(Run(d))
    settings = [r.settings() for r in runs]
    names = sorted(set().union(*settings))
    differ = [n for n in names if len({repr(s.get(n)) for s in settings}) > 1]
    for r, s in zip(runs, settings):
        r.variant = tuple((n, s.get(n)) for n in differ)
    if differ:
        warn(f"note: these runs differ in {', '.join(differ)}; runs that differ are drawn "
             f"apart, labelled with their values")
    return runs


def seeds_label(runs):
    """'1 seed', '3 seeds': how many seeds a line or bar averages."""
    n = len({r.seed for r in runs}) or 1
    return f"{n} seed" + ("s" if n > 1 else "")


# --------------------------------------------------------------------------- time axis
def step_to_time(steps, steps_per_epoch, epochs):
    """Training time (s) at global `steps`, interpolated linearly between epoch ends.

    Epoch k ends at step k * steps_per_epoch, at epochs[k-1]["train_time_s"]; step 0 is at 0 s.
    Steps after the last finished epoch (an unfinished run) are extrapolated at that epoch's
    time per step.  NaN when no epoch has finished, as there is no time to map to.
    """
    steps = np.asarray(steps, float)
    if not epochs:
        return np.full(steps.shape, np.nan)
    xs = np.array([0.0] + [e["epoch"] * steps_per_epoch for e in epochs])
    ts = np.array([0.0] + [e["train_time_s"] for e in epochs])
    t = np.interp(steps, xs, ts)
    rate = (ts[-1] - ts[-2]) / (xs[-1] - xs[-2])
    after = steps > xs[-1]
    t[after] = ts[-1] + (steps[after] - xs[-1]) * rate
    return t


def time_unit(max_seconds):
    """(seconds per unit, unit name) for times up to `max_seconds`: seconds under 2 minutes,
    minutes under 2 hours, else hours, so that no axis or table reads 0.001 h."""
    if max_seconds < 120.0:
        return 1.0, "s"
    return (60.0, "min") if max_seconds < 7200.0 else (3600.0, "h")


# --------------------------------------------------------------------------- output
def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only; also works without a display
    import matplotlib.pyplot as plt
    return plt


def out_base(out):
    """`out` without a .png/.pdf suffix, its folder created."""
    base, ext = os.path.splitext(str(out))
    if ext.lower() not in (".png", ".pdf"):
        base = str(out)
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    return base


def save_figure(fig, out):
    """Write `fig` as <out>.png and <out>.pdf (folder created), close it; the two paths."""
    base = out_base(out)
    paths = [base + ".png", base + ".pdf"]
    # "tight" keeps a legend wider than the panels inside the image
    fig.savefig(paths[0], dpi=150, bbox_inches="tight", pad_inches=0.1)
    fig.savefig(paths[1], bbox_inches="tight", pad_inches=0.1)
    pyplot().close(fig)
    return paths


def _legend_label(style, flag, runs=()):
    label = f"{style.label} ({flag})" if flag else style.label
    return f"{label}; {seeds_label(runs)}" if runs else label


def _group_flag(runs):
    flags = [r.flag for r in runs if r.flag]
    return "diverged" if "diverged" in flags else (flags[0] if flags else None)


def _figure_legend(fig, entries, ncol=4):
    """One legend below all panels, read row by row in legend order."""
    # about 0.075 inch per character of the longest label plus the handle (2.3 inches for
    # "ElasticTrainer (ρ=0.35)"), so a narrow figure or long labels get more rows
    entry = 0.6 + 0.075 * max(len(label) for _, label in entries)
    ncol = max(1, min(len(entries), ncol, int(fig.get_figwidth() // entry)))
    nrows = -(-len(entries) // ncol)
    # matplotlib fills a legend column by column; place entries so that rows read in order
    cells = [None] * (nrows * ncol)
    for k, entry in enumerate(entries):
        cells[(k % ncol) * nrows + k // ncol] = entry
    blank = pyplot().Line2D([], [], lw=0)  # fills the short last row
    cells = [c or (blank, "") for c in cells]
    fig.legend([h for h, _ in cells], [lab for _, lab in cells], loc="outside lower center",
               ncol=ncol, frameon=False)


def _series_mean(points):
    """points: list of per-run {x_key: (t, value)} -> sorted x keys with mean t, mean/min/max v."""
    keys = sorted(set().union(*[p.keys() for p in points])) if points else []
    t, mean, lo, hi = [], [], [], []
    for k in keys:
        got = [p[k] for p in points if k in p]
        t.append(np.mean([g[0] for g in got]))
        vals = [g[1] for g in got]
        mean.append(np.mean(vals))
        lo.append(np.min(vals))
        hi.append(np.max(vals))
    return np.array(t), np.array(mean), np.array(lo), np.array(hi)


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
        rho = "" if g.key.rho is None else f"{g.key.rho:g}"
        setting = (" " + ", ".join(f"{k}={v}" for k, v in g.key.variant) + " |") if variants else ""
        speed = "" if s is None else f"{s:.2f}x"
        rows.append(f"| {g.model} | {g.dataset} | {label} | {rho} |{setting} "
                    f"{len({r.seed for r in g.runs})} | {g.accuracy.mean():.2f} | "
                    f"{g.time_s.mean() / scale:.3g} | {speed} |")
    return "\n".join(rows) + "\n"


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


# --------------------------------------------------------------------------- Fig. 21
Selections = namedtuple("Selections", "epochs matrix predicted_ratio measured_ratio source")


def selection_matrix(run):
    """Selections(epochs, matrix [tensor, re-selection] of 0/1, predicted and measured
    step-time ratios (NaN where unknown), source) from summary.json's selections, or from the
    SELECTION_MASK and PREDICTED_RATIO events when the summary has none (no measured ratios:
    the events do not hold them)."""
    sels = run.summary.get("selections") or []
    if sels:
        epochs = np.array([s["epoch"] for s in sels], float)
        matrix = np.array([s["mask"] for s in sels], np.int32).T
        ratio = np.array([s.get("predicted_ratio", np.nan) for s in sels], float)
        measured = np.array([np.nan if s.get("measured_ratio") is None else s["measured_ratio"]
                             for s in sels], float)
        return Selections(epochs, matrix, ratio, measured, runlog.SUMMARY_FILE)
    steps, masks = runlog.read_tensors(run.path, runlog.SELECTION_MASK, run.events)
    if not masks:
        if run.rho is None:
            raise UserError(f"{run.path}: {run.train_type} is not an elastic scheme, so it has "
                            f"no tensor selections to plot")
        raise UserError(f"{run.path}: no tensor selection recorded yet")
    spe = run.summary["steps_per_epoch"]
    matrix = np.stack([np.asarray(m, np.int32).reshape(-1) for m in masks], axis=1)
    rsteps, rvals = run.scalars(runlog.PREDICTED_RATIO)
    by_step = dict(zip(rsteps.tolist(), rvals.tolist()))
    ratio = np.array([by_step.get(s, np.nan) for s in steps], float)
    return Selections(np.array(steps, float) / spe, matrix, ratio, np.full(len(steps), np.nan),
                      "events")


def plot_selection(run_dir, out):
    """Heat map of the tensors trained after each re-selection (x: epoch, y: tensor from input
    at the bottom to output at the top), with the fraction selected and the predicted step-time
    ratio above it.  Returns the written paths."""
    run = load_runs([run_dir])[0]
    sel = selection_matrix(run)
    plt = pyplot()
    n, m = sel.matrix.shape
    # each selection holds until the next one, the last until the end of the finished epochs
    gaps = np.diff(sel.epochs)
    step = float(np.median(gaps)) if len(gaps) else float(run.config.get("interval") or 1.0)
    end = float(len(run.epochs))
    if end <= sel.epochs[-1]:  # an unfinished run: show the last selection for one interval
        end = sel.epochs[-1] + step
    x_edges = np.append(sel.epochs, end)
    y_edges = np.arange(n + 1) - 0.5

    fig, (top, ax) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.0 if n > 40 else 5.0),
                                  gridspec_kw={"height_ratios": [1, 3.5]}, layout="constrained")
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    trained = "#1a1a1a"
    ax.pcolormesh(x_edges, y_edges, sel.matrix, cmap=ListedColormap(["white", trained]), vmin=0,
                  vmax=1, antialiased=False, rasterized=n * m > 20000)
    for e in x_edges[1:-1]:  # two equal selections in a row still read as two columns
        ax.axvline(e, color="0.6", lw=0.6)
    ax.set_ylim(-0.5, n - 0.5)
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # tensors are whole
    ax.set_xlabel("epoch (each column: one re-selection, held until the next)")
    ax.set_ylabel(f"tensor index (input → output, {n} tensors)")
    ax.legend([Patch(color=trained), Patch(facecolor="white", edgecolor="0.6")],
              ["trained", "frozen"], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
              fontsize=8)

    frac = sel.matrix.sum(axis=0) / n
    xs = np.append(sel.epochs, end)
    top.step(xs, np.append(frac, frac[-1]), where="post", color="#444444",
             label="fraction of tensors trained")
    if np.isfinite(sel.predicted_ratio).any():
        pr = sel.predicted_ratio
        top.step(xs, np.append(pr, pr[-1]), where="post", color="#d62728",
                 label="predicted step-time ratio")
    # a selection is kept after a correction when it was measured within rho before, even if
    # the corrected time model predicts it over: the measured line shows what the steps took
    if np.isfinite(sel.measured_ratio).any():
        mr = sel.measured_ratio
        top.step(xs, np.append(mr, mr[-1]), where="post", color="#1f77b4", ls="--",
                 label="measured step-time ratio")
    if run.rho is not None:
        top.axhline(run.rho, color="#d62728", ls=":", lw=1, label=f"ρ = {run.rho:g}")
    top.set_ylim(0, max(1.05, np.nanmax(np.concatenate([sel.predicted_ratio,
                                                         sel.measured_ratio, [0]])) + 0.05))
    top.set_ylabel("fraction")
    top.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.05), frameon=False, fontsize=8)
    ax.set_xlim(x_edges[0], x_edges[-1])
    if m <= 24:
        ax.set_xticks(x_edges)
        ax.set_xticklabels(sparse_tick_labels(x_edges), fontsize=8)
    status = f" ({run.flag})" if run.flag else ""
    top.set_title(f"{run.model} on {run.dataset}: {scheme_label(run.train_type, run.rho)}"
                  f"{status}\ntensors selected at each re-selection")
    return save_figure(fig, out)


def sparse_tick_labels(edges, min_gap=0.04):
    """Labels for ticks at `edges`, blank where a tick sits closer than min_gap of the axis
    range to the last labelled one: a correction a few steps after a re-selection would print
    its epoch on top of the re-selection's ("00.13")."""
    edges = [float(e) for e in edges]
    span = (max(edges) - min(edges)) or 1.0
    labels, last = [], None
    for e in edges:
        if last is None or e - last >= min_gap * span:
            labels.append(f"{e:.3g}")
            last = e
        else:
            labels.append("")
    return labels


# --------------------------------------------------------------------------- profiler table
def plot_profile(table_path, out):
    """The profiler's t_dw/t_dy bars from a table file.  Returns the written paths."""
    from elastictrainer.profiler.table import load_table

    base = out_base(out)
    draw_profile(load_table(table_path), base + ".png")  # it writes <base>.png and <base>.pdf
    return [base + ".png", base + ".pdf"]


def draw_profile(table, path):
    """Bars of t_dw and t_dy per tensor from the input (left) to the output (right); PNG + PDF.
    Returns the PNG's path."""
    plt = pyplot()

    tensors = sorted(table["tensors"], key=lambda t: -t["rank"])
    n = len(tensors)
    x = np.arange(n)
    dw = np.array([t["t_dw_ms"] for t in tensors])
    dy = np.array([t["t_dy_ms"] for t in tensors])
    est = np.array([t["estimated"] for t in tensors])
    fig, ax = plt.subplots(figsize=(max(6.0, min(18.0, 0.08 * n + 4)), 3.6))
    ax.bar(x, dw, color="#1f77b4", label="t_dw (weight gradient + update)")
    ax.bar(x, dy, bottom=dw, color="#ff7f0e", label="t_dy (error gradient)")
    if est.any():
        ax.bar(x[est], dw[est], color="none", edgecolor="k", hatch="//", label="estimated (FLOPs)")
    ax.set_xlabel("tensor (input → output)")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("op time per step (ms)")
    ax.margins(x=0.01, y=0.35)  # the tallest bar clear of the frame and of the legend
    ax.set_title(f"{table['model']}: input {table['input_size']}, batch {table['batch_size']}; "
                 f"forward {table['t_fp_ms']:.0f} ms, full step {table['t_full_ms']:.0f} ms")
    ax.set_xlim(-1, n)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, os.path.splitext(path)[0])[0]
