"""The prefix cache benchmark's report (scripts/bench_prefix_cache.py): the fields a run's
summary.json gives of its cache, and the tables of its rows (each run; the mean over seeds
against the same seed's reference run; the flip at each cut; the ResNet50 step bench's step
ratios against their predictions by the time model, eq. 3's T(m) / T_full).

A row is plain data: seed, run (its label), rho, best and last-3-epochs accuracy, training time
and its ratio to the reference's, the run's own wall-clock estimate, the measured step ratio,
the cache's cuts, the share of steps it served, the time spent filling it, the tensors trained
and the load around the run; a run refused below the forward floor has "error" instead.  Plain
Python, no TensorFlow.
"""

# the model.fit part's reference run, and how the tables name it
FIT_REFERENCE, FIT_AGAINST = "model.fit, all weights", "plain fit's"

# The cache settings the smallcnn rows compare (--caches): off is the paper's protocol, auto the
# default; viewsK keeps K augmented views of each image, fp16 stores them in float16.
CACHES = {"off": dict(cache_frozen_prefix=False),
          "auto": dict(cache_frozen_prefix="auto"),
          "views1": dict(cache_frozen_prefix=True, cache_views=1),
          "views2": dict(cache_frozen_prefix=True, cache_views=2),
          "views3": dict(cache_frozen_prefix=True, cache_views=3),
          "views2_fp16": dict(cache_frozen_prefix=True, cache_views=2, cache_dtype="float16")}


def cache_label(cache):
    return "" if cache == "off" else f" + cache ({cache})"


def cache_flags(caches):
    return "; ".join(f"{c}: `" + " ".join(f"--{k} {str(v).lower()}" for k, v in CACHES[c].items())
                     + "`" for c in caches)


def cache_fields(summary, selection_cuts=False):
    """A row's cache fields from a run's summary.json: the cuts its cache was built at (with
    selection_cuts, also those its selections recorded: the command line's records carry
    them), the share of steps served from it, the seconds spent filling it and its largest
    build in MB (None without a cache)."""
    pc = summary.get("prefix_cache") or {}
    builds = pc.get("builds", [])
    cuts = {b["cut"] for b in builds}
    if selection_cuts:
        cuts |= {s["cut"] for s in summary.get("selections", []) if s.get("cut")}
    return {"cuts": sorted(cuts), "served_share": pc.get("served_share"),
            "fill_s": pc.get("fill_s"),
            "cache_mb": max((b["bytes"] / 2**20 for b in builds), default=None)}


def runs_table(rows, against="full training's"):
    def f(v, fmt):
        return "" if v is None else fmt.format(v)

    lines = [f"| seed | run | rho | best accuracy | last 3 epochs | training time | / {against} "
             "| run's estimate | cached step ratio | tensors (last epoch) | cut | "
             "steps served from the cache | filling it | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seed']} | {r['run']} | {r['rho']:g} | refused: below the "
                         f"forward floor |  |  |  |  |  |  |  |  |  |  |")
            continue
        cache = (f"{100 * r['served_share']:.0f}%" if r["served_share"] is not None else "")
        lines.append(
            f"| {r['seed']} | {r['run']} | {f(r['rho'], '{:g}')} | {r['best']:.1f}% | "
            f"{r['last3']:.1f}% | {r['train_time_s']:.1f} s | {f(r['time_ratio'], '{:.2f}')} | "
            f"{f(r['wall_ratio'], '{:.2f}')} | {f(r['step_ratio'], '{:.2f}')} | "
            f"{r['tensors']}/20 | {', '.join(r['cuts'])} | {cache} | "
            f"{f(r['fill_s'], '{:.1f} s')} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    return "\n".join(lines)


def means_table(rows, reference="full training", against="full training's"):
    """One row per run over the seeds: mean best accuracy and its points under the same seed's
    `reference` run, mean of the last 3 epochs, mean time ratio and cached step ratio."""
    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    full = {r["seed"]: r for r in rows if r["run"] == reference}
    lines = [f"| run | rho | seeds | best accuracy | under {against} | last 3 epochs | "
             f"time / {against} | cached step ratio |", "|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["run"], r["rho"]) for r in rows):
        group = [r for r in rows if (r["run"], r["rho"]) == key and "error" not in r]
        if not group:
            lines.append(f"| {key[0]} | {key[1]:g} | | refused: below the forward floor | | | "
                         f"| |")
            continue
        under = mean([full[r["seed"]]["best"] - r["best"] for r in group if r["seed"] in full])
        under = round(under, 1) + 0.0  # a mean that rounds to 0 is 0.0, not -0.0
        ratio = mean([r["step_ratio"] for r in group])
        lines.append(
            f"| {key[0]} | {'' if key[1] is None else f'{key[1]:g}'} | {len(group)} | "
            f"{mean([r['best'] for r in group]):.1f}% | {under:.1f} | "
            f"{mean([r['last3'] for r in group]):.1f}% | "
            f"{mean([r['time_ratio'] for r in group]):.2f} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines)


def flip_table(rows):
    lines = ["| cut | shape | relative error | without the border columns |", "|---|---|---|---|"]
    lines += [f"| {r['cut']} | {'x'.join(map(str, r['shape']))} | {r['relative_error']:.3f} | "
              f"{r['without_border_columns']:.3f} |" for r in rows]
    return "\n".join(lines)


def resnet50_table(result):
    lines = [f"Forward floor without the cache {result['forward_floor']:.2f} of a full step "
             f"({result['rows'][0]['full_step_ms']:.0f} ms); load {result['load']:.1f} at the "
             f"end.\n",
             "| selection | tensors | cut | step ratio uncached (predicted) | step ratio cached "
             "(predicted) |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['selection']} | {r['tensors']} | {r['cut'] or ''} | "
                     f"{r['uncached_ratio']:.2f} ({r['predicted_uncached']:.2f}) | "
                     f"{r['cached_ratio']:.2f} ({r['predicted_cached']:.2f}) |")
    return "\n".join(lines)


def _over_seeds(heading, rows, reference="full training", against="full training's"):
    """A part of rows over seeds: its heading, the mean over the seeds, then each run."""
    return (f"{heading}\n\nMean over the seeds\n\n{means_table(rows, reference, against)}"
            f"\n\nEach run\n\n{runs_table(rows, against)}\n\n")


def document(results, dates, machine, parts, command, fit_text, fit_epochs, flip_images):
    """The benchmark's Markdown: each part in `results` (a part's rows by its name) with its
    date (`dates`), on `machine` (its line); `parts`: their order; command: the smallcnn
    setting's flags; fit_text, fit_epochs: the model.fit task in words and its epochs;
    flip_images: the images the flip part compared."""
    text = (f"Machine: {machine}; run "
            + ", ".join(f"{part} {dates[part]}" for part in parts if part in results) + ".\n\n")
    if "smallcnn" in results:
        caches = dict.fromkeys(r["cache"] for r in results["smallcnn"])  # the runs' own
        text += _over_seeds(f"The smallcnn setting (`{command} --rho R --seed S`; each run's "
                            f"cache setting in its name: {cache_flags(caches)})",
                            results["smallcnn"])
    if "fit" in results:
        text += _over_seeds(f"A pretrained Keras 3 CNN in model.fit ({fit_text}), {fit_epochs} "
                            f"epochs; ElasticCallback(rho=R, bn_mode=\"inference\"), with the "
                            f"default cache (auto) and with cache_frozen_prefix=False (off)",
                            results["fit"], FIT_REFERENCE, FIT_AGAINST)
    if "flip" in results:
        text += (f"A horizontal flip applied at the cut instead of the input: how far "
                 f"flip(prefix(x)) is from prefix(flip(x)) at each cut of the smallcnn "
                 f"setting's model (pretrained weights, {flip_images} training images)\n\n"
                 f"{flip_table(results['flip'])}\n\n")
    if "resnet50" in results:
        text += (f"ResNet50, 224 px, batch 4, SGD, random weights: step ratios against full "
                 f"steps timed in the same rounds\n\n{resnet50_table(results['resnet50'])}\n")
    return text
