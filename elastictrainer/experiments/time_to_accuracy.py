"""Speed reported the way peers report it (PieBridge, Cache & Reuse): the time a run takes to
reach an accuracy level, against full training's time to the same level.

Each run gives a curve: its test accuracy after every epoch against its wall clock so far
(training time, plus whatever the run paid before its first step that full training does not:
profiling).  The levels come from full training's best accuracy on the same configuration:
95% and 99% of it, and within 1 point of it.  A scheme's time to a level is the first epoch's
time at which its curve reaches it ("never" when it does not); its speedup is full training's
time to that level over its own.  Over seeds, the median.  Plain Python, no TensorFlow.
"""
import statistics

from elastictrainer.plotting.time_to_accuracy import LEVELS, curve  # noqa: F401

NEVER = None


class Refused(str):
    """A run that did not train (its settings were refused, e.g. a rho below the forward
    floor): the reason, in place of its curve."""


def time_to(points, level):
    """The first time `points` (a curve) reaches `level`, or NEVER."""
    for seconds, accuracy in points:
        if accuracy >= level:
            return seconds
    return NEVER


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
