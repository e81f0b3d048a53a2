"""What every figure shares: scheme labels and styles, reading run directories, the
time axis, and writing figures."""
import os
import sys
from collections import OrderedDict, namedtuple

import numpy as np

from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.method.schemes import SCHEMES


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
NOT_A_VARIANT = {"seed", "run_name", "logdir", "progress", "timing_table", "profile_in",
                 "data_dir", "save_model", "save_txt", "energy", "model_name", "dataset_name",
                 "train_type", "rho"}
Style = namedtuple("Style", "label color rank")

# summary["status"] -> legend flag; "finished" has none.
STATUS_FLAGS = {"running": "unfinished", "interrupted": "unfinished", "nan": "diverged",
                "failed": "failed"}


def scheme_label(train_type, rho=None, variant=()):
    """'ElasticTrainer (ρ=0.4)', 'Full training', 'Full training, learning_rate=0.003', ...;
    an unknown train_type is shown as is."""
    base = SCHEMES[train_type].label if train_type in SCHEMES else train_type
    label = base if rho is None else f"{base} (ρ={runlog.rho_text(rho)})"
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
    # rho auto after every ratio: its selections' ratios vary over the run
    rho = -1.0 if key.rho is None else 2.0 if isinstance(key.rho, str) else key.rho
    return (rank, key.train_type, rho, repr(key.variant))


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


NOT_A_RUN = "not a run directory (a table compare wrote, or a profile's trace)"


def _written_beside_runs(path):
    """Whether `path` is what the commands write beside run directories in --logdir: a
    file (compare's <name>_compare.md) or a profile's trace (<table>_profile/plugins/profile)."""
    path = str(path)
    if os.path.isfile(path):
        return True
    return (os.path.isdir(os.path.join(path, "plugins", "profile"))
            and not os.path.isfile(os.path.join(path, runlog.SUMMARY_FILE)))


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
    runs, seen, skipped = [], set(), []
    for p in paths:
        if _written_beside_runs(p):  # `logs/*` holds them: skipped, not refused
            warn(f"note: skipped {p}: {NOT_A_RUN}")
            skipped.append(str(p))
            continue
        for d in find_run_dirs(p):
            real = os.path.realpath(d)
            if real not in seen:
                seen.add(real)
                runs.append(Run(d))
    if not runs:
        raise UserError(f"no run directory among {', '.join(skipped)}: {NOT_A_RUN}")
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
    """'1 seed', '3 seeds', '3 runs, 1 seed': what a line or bar averages (runs of one seed
    repeated count as runs: their spread is the run-to-run noise, not the seeds')."""
    n = len({r.seed for r in runs}) or 1
    seeds = f"{n} seed" + ("s" if n > 1 else "")
    return seeds if len(runs) <= n else f"{len(runs)} runs, {seeds}"


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
