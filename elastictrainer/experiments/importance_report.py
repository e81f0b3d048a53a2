"""The importance benchmark's arithmetic and tables (scripts/bench_importance.py --configs;
the measurement is importance_truth.py's): rank correlation, depth bins, the truth's own
split-half agreement and the ceiling it puts on any estimate's, each estimator's summary against
the truth, and the markdown tables.  Plain numpy, no TensorFlow.
"""
import numpy as np


def spearman(a, b):
    """Spearman rank correlation (average ranks for ties; 0 when either side is constant)."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # average ties
            idx = x == v
            r[idx] = r[idx].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt(np.sum(ra * ra) * np.sum(rb * rb))
    return float(np.sum(ra * rb) / den) if den > 0 else 0.0


def split_half(by_batch):
    """The truth's own noise: the rank correlation between dropN measured on the first and on
    the second half of the held-out batches (`by_batch`: one row per tensor, one column per
    batch); None with fewer than two batches.  By Spearman-Brown the whole held-out set ranks
    as reliably as 2r / (1 + r), and an estimate that ranked the tensors exactly as their true
    drops would be measured at about the square root of that (ceiling)."""
    by_batch = np.asarray(by_batch, float)
    half = by_batch.shape[1] // 2
    if half < 1:
        return None
    return spearman(by_batch[:, :half].mean(1), by_batch[:, half:2 * half].mean(1))


def ceiling(r):
    """The rank correlation with the truth an exact estimate would be measured at, given the
    truth's split-half correlation `r` (split_half); 0 when the halves do not agree."""
    return float(np.sqrt(2 * r / (1 + r))) if r > 0 else 0.0


def depth_bins(n, bins):
    """`bins` contiguous index ranges over n tensors, input side first."""
    edges = np.linspace(0, n, bins + 1).round().astype(int)
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def summarize(drop, estimates, steps, probes, bins=8, shares=(0.5, 0.7, 0.9)):
    """Per estimator: Spearman's rank correlation with dropN; by depth bin, the realized drop
    against the drop the estimate predicts for `steps` steps (its per-batch value times steps);
    and the realized drop of the selection a share of its positive estimate picks (the highest
    first, dropN summed over the picked tensors)."""
    drop = np.asarray(drop, float)
    out = {}
    for name, v in estimates.items():
        v = np.asarray(v, float)
        pos = np.clip(v, 0, None)
        order = np.argsort(-pos, kind="stable")
        picks = {}
        for share in shares:
            if pos.sum() <= 0:
                picks[f"{share:g}"] = None
                continue
            cum = np.cumsum(pos[order]) / pos.sum()
            pick = order[:int(np.searchsorted(cum, share)) + 1]
            picks[f"{share:g}"] = {"tensors": int(len(pick)), "deepest": int(pick.min()),
                                   "realized_drop": float(drop[pick].sum())}
        depth = []
        for r in depth_bins(len(drop), bins):
            idx = list(r)
            predicted = float(v[idx].sum()) * steps / probes
            realized = float(drop[idx].sum())
            depth.append({"tensors": [idx[0], idx[-1]], "predicted": predicted,
                          "realized": realized,
                          "ratio": realized / predicted if predicted else None})
        out[name] = {"spearman": spearman(v, drop), "positive": int((v > 0).sum()),
                     "by_depth": depth, "selection": picks}
    return out


def markdown(data):
    """The measurement's tables: per configuration (mean over its seeds), each estimator's
    rank correlation with the truth, the realized drop of the selection keeping 70% of its
    estimate, and the realized over predicted drop by depth."""
    lines = [f"Machine: {data['machine']}; {data['date']}; `{data['command']}`.", ""]
    by_config = {}
    for run in data["runs"]:
        by_config.setdefault(run["config"], []).append(run)
    for name, runs in by_config.items():
        names = list(runs[0]["summary"])
        steps = runs[0]["steps"]
        halves = [r["split_half"] for r in runs if r.get("split_half") is not None]
        noise = "" if not halves else (
            f"; dropN on the two halves of the held-out images ranks the tensors alike at "
            f"{np.mean(halves):+.2f}, so an exact estimate would be measured at about "
            f"{ceiling(np.mean(halves)):+.2f}")
        lines += [f"**{name}** ({len(runs)} seed(s); dropN: held-out loss drop of {steps} SGD "
                  f"steps of each of {len(runs[0]['dropN'])} tensors alone; held-out loss "
                  f"{np.mean([r['held_out_loss'] for r in runs]):.3f}{noise}):", "",
                  "| estimator | rank correlation with dropN | positive | the 70% selection: "
                  "tensors, deepest | its realized drop |", "|---|---|---|---|---|"]
        for est in names:
            s = [r["summary"][est] for r in runs]
            sel = [x["selection"]["0.7"] for x in s if x["selection"]["0.7"]]
            pick = (f"{np.mean([x['tensors'] for x in sel]):.0f}, "
                    f"{np.mean([x['deepest'] for x in sel]):.0f}") if sel else "none"
            real = f"{np.mean([x['realized_drop'] for x in sel]):+.3f}" if sel else "-"
            lines.append(f"| {est} | {np.mean([x['spearman'] for x in s]):+.2f} | "
                         f"{np.mean([x['positive'] for x in s]):.0f} | {pick} | {real} |")
        bins = runs[0]["summary"][names[0]]["by_depth"]
        lines += ["", "Realized over predicted drop by depth (tensors, input side first; sums "
                  "over the bin's tensors, mean over seeds):", "",
                  "| tensors | realized | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for i, b in enumerate(bins):
            realized = np.mean([r["summary"][names[0]]["by_depth"][i]["realized"] for r in runs])
            cells = []
            for est in names:
                predicted = np.mean([r["summary"][est]["by_depth"][i]["predicted"]
                                     for r in runs])
                cells.append(f"{realized / predicted:+.3f}" if predicted else "-")
            lines.append(f"| {b['tensors'][0]}-{b['tensors'][1]} | {realized:+.3f} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
