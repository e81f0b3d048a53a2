"""Speed reported the way peers report it (PieBridge, Cache & Reuse): the time a run takes to
reach an accuracy level, against full training's time to the same level.

Each run gives a curve: its test accuracy after every epoch against its wall clock so far
(training time, plus whatever the run paid before its first step that full training does not:
profiling).  The levels come from full training's best accuracy on the same configuration:
95% and 99% of it, and within 1 point of it.  A scheme's time to a level is the first epoch's
time at which its curve reaches it ("never" when it does not); its speedup is full training's
time to that level over its own.  Over seeds, the median.

Where a run's time went (costs): its training time and, within it, what the method spends that
the same tensors trained by hand would not (timed full steps, compiling a selection's step,
probes and solving) or spends alike (filling the prefix cache), read from its summary.json, with
the first profiling it paid before training; and its time to within 1 point with the timing
table read, as a second run of the same model and batch shape reads it: the run's own curve,
which the benchmark's runs measured with a table profiled before them.  Beside them, the step
ratio the run's selections measured against full steps (a cached selection's: its suffix step
over a full step) and the time model's for them (eq. 3's T(m) over T_full): 1 / ratio is the
most a scheme could gain per step, its limit; and how often a re-selection that moved the
cache's cut filled the cache again.

A level means something only above the noise: full training's test accuracy still moves from
epoch to epoch at its end, and `noise` gives that spread (the largest minus the smallest of its
last NOISE_EPOCHS epochs, median over seeds) to print beside the levels.  Plain Python, no
TensorFlow.
"""
import statistics

from elastictrainer.plotting.time_to_accuracy import LEVELS, NEVER, curve, time_to  # noqa: F401

# full training's last epochs whose test accuracies give the levels' noise: the last two, where
# the cosine schedule's rate is lowest, so that the change between them is noise rather than
# the climb of a run that is still learning
NOISE_EPOCHS = 2


class Refused(str):
    """A run that did not train (its settings were refused, e.g. a rho below the forward
    floor): the reason, in place of its curve."""


def best(points):
    return max((a for _, a in points), default=None)


def _median(values):
    """The median of the seeds' times, a seed that never got there counting as later than
    every one that did; NEVER when the median itself is such a seed."""
    padded = sorted(float("inf") if v is NEVER else v for v in values)
    m = statistics.median(padded)
    return NEVER if m == float("inf") else m


def summarize(curves, reference="full_training"):
    """Per scheme, from {scheme: [curve per seed]} (the seeds in the same order for every
    scheme): the median best accuracy and wall clock, and for each level (LEVELS) the median
    time to it and the speedup over `reference`'s, each seed's levels set by that seed's
    reference run.  Returns {scheme: {...}}."""
    refs = curves[reference]
    out = {}
    for scheme, runs in curves.items():
        if len(runs) != len(refs):
            raise ValueError(f"{scheme} has {len(runs)} runs, {reference} {len(refs)}")
        refused = [r for r in runs if isinstance(r, Refused)]
        if refused:
            out[scheme] = {"runs": len(runs), "refused": str(refused[0])}
            continue
        row = {"runs": len(runs),
               "best_accuracy": statistics.median(best(c) for c in runs),
               "wall_clock_s": statistics.median(c[-1][0] for c in runs),
               "under_reference_best": statistics.median(best(r) - best(c)
                                                         for c, r in zip(runs, refs))}
        for key, _, level_of in LEVELS:
            times, ref_times = [], []
            for c, r in zip(runs, refs):
                level = level_of(best(r))
                times.append(time_to(c, level))
                ref_times.append(time_to(r, level))
            mine, theirs = _median(times), _median(ref_times)
            row[key] = {"time_s": mine, "per_seed_s": times,
                        "speedup": (theirs / mine if mine not in (NEVER, 0) and theirs
                                    is not NEVER else NEVER)}
        out[scheme] = row
    return out


def noise(reference_curves, last=NOISE_EPOCHS):
    """The levels and their noise from the reference's curves (one per seed): each level's
    median over seeds (LEVELS' keys) and "spread", the median over seeds of the largest minus
    the smallest test accuracy of the last `last` epochs, in points."""
    runs = [c for c in reference_curves if not isinstance(c, Refused) and c]
    if not runs:
        return {}
    out = {key: statistics.median(level_of(best(c)) for c in runs) for key, _, level_of in LEVELS}
    tails = [[a for _, a in c[-last:]] for c in runs]
    out["spread"] = statistics.median(max(t) - min(t) for t in tails)
    out["epochs"] = min(last, min(len(c) for c in runs))
    return out


def noise_words(levels):
    """One line: each level and the spread beside it."""
    if not levels:
        return ""
    named = ", ".join(f"{label} {levels[key]:.1f}%" for key, label, _ in LEVELS)
    return (f"Levels (median over seeds): {named}; full training's test accuracy moves by "
            f"{levels['spread']:.1f} points over its last {levels['epochs']} epochs (largest "
            f"minus smallest, median over seeds), the noise of each level.")


# (key, column): where a run's time went, in seconds (costs)
COSTS = (("train_s", "training"), ("fill_s", "filling the cache"),
         ("timing_s", "timed full steps"), ("compiling_s", "compiling"),
         ("probes_s", "probes and solving"), ("profiling_s", "first profiling"))


def costs(summary, profiling_s=0.0):
    """Where one run's time went, from its summary.json dict (COSTS, in seconds), and its curve
    with the timing table read ("read": no profiling before its first step)."""
    parts = summary.get("reselection_overhead_parts_s") or {}
    cache = summary.get("prefix_cache") or {}
    return {"train_s": summary["train_time_s"], "fill_s": cache.get("fill_s") or 0.0,
            "timing_s": parts.get("timing full steps", 0.0),
            "compiling_s": parts.get("compiling", 0.0),
            "probes_s": parts.get("importance", 0.0) + parts.get("solving", 0.0),
            "profiling_s": float(profiling_s), "read": curve(summary),
            # the cache's stores after its first: each a re-selection that moved the cut
            "refills": max(len(cache.get("builds") or []) - 1, 0),
            "ratio": summary.get("measured_ratio"), "ratio_model": summary.get("estimated_ratio")}


def summarize_costs(costs_by_scheme, reference_curves):
    """Per scheme, from {scheme: [costs() per seed]} (the seeds in reference_curves' order):
    the median of each of COSTS, and the median time to within 1 point of the reference's best
    with the profiling paid ("pt1_s", the time-to-accuracy table's) and with the table read
    ("pt1_read_s")."""
    out = {scheme: {key: statistics.median(r[key] for r in runs) for key, _ in COSTS}
           for scheme, runs in costs_by_scheme.items()}
    for scheme, runs in costs_by_scheme.items():
        out[scheme]["refills"] = statistics.median(r.get("refills", 0) for r in runs)
        for key in ("ratio", "ratio_model"):  # None for schemes that time no step
            known = [r[key] for r in runs if r.get(key) is not None]
            out[scheme][key] = statistics.median(known) if known else None
    # the reference is keyed apart: a scheme of the same name is one of the rows
    for name, shift in (("pt1_s", True), ("pt1_read_s", False)):
        curves = {scheme: [[(t + (r["profiling_s"] if shift else 0.0), a) for t, a in r["read"]]
                           for r in runs] for scheme, runs in costs_by_scheme.items()}
        levels = summarize({" reference": reference_curves, **curves}, reference=" reference")
        for scheme in out:
            out[scheme][name] = levels[scheme]["pt1"]["time_s"]
    return out


def costs_table(summary, labels=None):
    """Markdown rows of summarize_costs()'s result, one per scheme."""
    labels = labels or {}
    head = (["scheme"] + [label for _, label in COSTS]
            + ["to within 1 point", "the same, table read", "refills",
               "step ratio measured / time model (limit)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scheme, row in summary.items():
        cells = [labels.get(scheme, scheme)] + [f"{row[key]:.1f} s" for key, _ in COSTS]
        cells += ["never" if row[k] is NEVER else f"{row[k]:.1f} s"
                  for k in ("pt1_s", "pt1_read_s")]
        refills = row.get("refills")  # None: costs recorded before refills were counted
        cells += ["n/a" if refills is None else f"{refills:g}", _ratio_cell(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio_cell(row):
    ratio, model = row.get("ratio"), row.get("ratio_model")
    if ratio is None and model is None:
        return "n/a"
    measured = "n/a" if ratio is None else f"{ratio:.3f}"
    limit = f" ({1 / ratio:.1f}x)" if ratio else ""
    return f"{measured} / {'n/a' if model is None else f'{model:.3f}'}{limit}"


def table(summary, labels=None):
    """Markdown rows of summarize()'s result, one per scheme."""
    labels = labels or {}
    head = ["scheme", "runs", "best accuracy", "under full's best"]
    for _, label, _ in LEVELS:
        head += [f"time to {label}", "speedup"]
    head.append("wall clock")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scheme, row in summary.items():
        if "refused" in row:
            reason = row["refused"].split(";")[0].replace("|", "/")
            lines.append(f"| {labels.get(scheme, scheme)} | {row['runs']} | refused: {reason} |"
                         + " |" * (len(head) - 3))
            continue
        cells = [labels.get(scheme, scheme), str(row["runs"]), f"{row['best_accuracy']:.1f}%",
                 f"{row['under_reference_best']:.1f}"]
        for key, _, _ in LEVELS:
            t, s = row[key]["time_s"], row[key]["speedup"]
            cells += ["never" if t is NEVER else f"{t:.1f} s",
                      "never" if s is NEVER else f"{s:.2f}x"]
        cells.append(f"{row['wall_clock_s']:.1f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_sweep_table(sweep):
    """Markdown rows of a learning-rate sweep ({"chosen", "curves": {rate: curve}}): each
    rate's best and per-epoch test accuracy."""
    lines = ["| learning rate | best test accuracy | test accuracy per epoch |", "|---|---|---|"]
    for lr, points in sweep["curves"].items():
        mark = " (chosen)" if lr == sweep["chosen"] else ""
        per_epoch = ", ".join(f"{a:.1f}" for _, a in points)
        lines.append(f"| {lr}{mark} | {best(points):.1f}% | {per_epoch} |")
    return "\n".join(lines)


def config_text(name, summary, labels=None):
    """One configuration's block of the benchmark's figures text: its levels with their noise,
    the time-to-accuracy table, its learning-rate sweep and where the time went, each where
    `summary` holds it."""
    lines = [f"**{name}** ({summary['runs']} seed(s)):", ""]
    if summary.get("levels"):
        lines += [noise_words(summary["levels"]), ""]
    lines += [table(summary["schemes"], labels), ""]
    if summary.get("lr_sweep"):
        sweep = summary["lr_sweep"]
        lines += [f"Full training's learning rate, {name} (seed {sweep['seed']}; the same "
                  f"settings otherwise):", "", lr_sweep_table(sweep), ""]
    if summary.get("costs"):
        over = ("" if len(summary.get("costs_seeds") or ()) in (0, summary["runs"]) else
                f" of seed(s) {', '.join(map(str, summary['costs_seeds']))}, the ones whose "
                f"costs are on record")
        lines += [f"Where the time went, {name} (median seconds{over}; filling the cache, "
                  f"timed full steps, compiling and probes are within training; an elastic run "
                  f"paid the first profiling before it):", "",
                  costs_table(summary["costs"], labels), ""]
    return "\n".join(lines[:-1])
