"""README.md's excerpt of each benchmark's results, one block per benchmark (README_BLOCKS),
each rendered from the benchmark's figures/<name>.json: its numbers, the machine and the date it
ran on, and the flags its runs took; where the .json does not record those flags, the note of
its figures/<name>.md says them in its own words.  Each function reads the figures directory it
is given; perfdoc.py puts what they render between README.md's markers.  No TensorFlow.
"""
import os

_NAMES = {"smallcnn": "smallcnn", "mobilenetv2": "MobileNetV2", "resnet50": "ResNet50",
          "cnn": "CNN"}


def _load(name, figures):
    import json

    with open(os.path.join(figures, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def _note(name, figures):
    """The last paragraph of the benchmark's .md: its settings, in its own words."""
    with open(os.path.join(figures, f"{name}.md"), encoding="utf-8") as f:
        return f.read().strip().split("\n\n")[-1]


def _machine(m):
    """'2 cores of an AMD EPYC, TensorFlow 2.21.0' from machine_info or machine_text."""
    if isinstance(m, dict):
        cpu, cores, tf = m["cpu"], m["cores"], m["tensorflow"]
    else:
        parts = m.split(", ")
        cpu, cores, tf = parts[0], parts[1].split()[0], parts[-1].split()[-1]
    article = "an" if cpu[:1].upper() in "AEIOU" else "a"
    return f"{cores} cores of {article} {cpu}, TensorFlow {tf}"


def _ran(script, machine, date):
    return f"*`python scripts/{script}` on {_machine(machine)}, {date}*"


def _row(cells):
    return "| " + " | ".join(cells) + " |"


def _table(head, rows):
    return "\n".join([_row(head), "|---" * len(head) + "|"] + [_row(r) for r in rows])


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _points(under):
    """Points under a reference, as the tables say it: "0.4 under", "1.2 over" (a mean that
    rounds to 0.0 is "0.0 under", not "0.0 over")."""
    under = round(under, 1) + 0.0
    return f"{abs(under):.1f} {'under' if under >= 0 else 'over'}"


def readme_command(figures):
    """README command 1's table: the command as a newcomer runs it in a fresh clone
    (scripts/bench_readme_command.py) at seed 0, the README's own, and the note of its .md (the
    seeds in one sentence)."""
    d = _load("bench_readme_command", figures)
    seed = next(r for r in d["results"] if r["seed"] == 0)
    rho = next(f.split()[1] for f in d["command"].split(" --")[1:] if f.startswith("rho "))
    rows = []
    for label, s in seed["schemes"].items():
        ratio = s["measured_ratio"]
        rows.append([label, rho if label == "ElasticTrainer" else "", f"{s['best']:.1f}%",
                     f"{s['last']:.1f}%", f"{s['time_ratio']:.2f}",
                     "" if ratio is None else f"{ratio:.2f}", f"{s['selected']}/{s['tensors']}"])
    return "\n".join([
        _table(["scheme", "rho", "best test accuracy", f"mean of the last {d['last_epochs']} "
                "epochs", "time / full training's", "measured step ratio", "tensors trained"],
               rows), "",
        f"{_ran('bench_readme_command.py', d['machine'], d['date'])}, seed 0, in a fresh clone: "
        f"`{seed['command']}`, {seed['command_s'] / 60:.1f} min.  "
        f"{_note('bench_readme_command', figures)}"])


def readme_bench_distributed(figures):
    """Step time, step ratio and all-reduced bytes per topology: full training and the first
    rho's elastic run."""
    d = _load("bench_distributed", figures)
    rows = []
    for topology, runs in d["topologies"].items():
        rhos = [r["rho"] for r in runs if r["rho"] is not None]
        for r in runs:
            if r["rho"] is None or r["rho"] == rhos[0]:
                ratio = r["measured_ratio"]
                rows.append([topology, r["run"], f"{r['step_ms']:.1f} ms",
                             "" if ratio is None else f"{ratio:.3f}",
                             f"{r['allreduce_kb']:.0f} KB ({r['allreduce_share']:.2f})"])
    return "\n".join([
        _table(["devices", "run", "step", "step ratio", "all-reduced per step (of full's)"],
               rows), "",
        f"{_ran('bench_distributed.py', d['machine'], d['date'])}: "
        f"{_note('bench_distributed', figures)}"])


def _cell_name(settings):
    return (f"{_NAMES.get(settings['model_name'], settings['model_name'])}, "
            f"{settings['input_size']} px, batch {settings['batch_size']}")


def readme_bench_runtime(figures):
    """Accuracy, time and step ratio per cell, and the profiler's side of each timing table."""
    d = _load("bench_runtime", figures)
    cells = list(d["cells"].values())
    rows, profiles = [], {}
    for c in cells:
        r, s = c["results"], c["settings"]
        ratio = r["measured_step_ratio"]
        selected = r["selected_tensors"][-1] if r["selected_tensors"] else r["num_tensors"]
        rows.append([_cell_name(s), str(r["steps"]), f"{r['full_step_ms']:.0f} ms",
                     f"{r['wall_ratio_measured']:.2f} ({r['wall_ratio_estimated']:.2f})",
                     "not timed" if ratio is None else f"{ratio:.3f}",
                     f"{100 * r['overhead_share']:.1f}%", f"{selected} of {r['num_tensors']}",
                     f"{r['best_accuracy_full']:.1f}% / {r['best_accuracy_elastic']:.1f}%"])
        profiles.setdefault(c["profile"]["path"], (s, c["profile"]))
    first = cells[0]["settings"]
    common = {k: v for k, v in first.items()
              if all(c["settings"].get(k) == v for c in cells)}
    flags = " ".join(f"--{k} {str(common[k]).lower() if isinstance(common[k], bool) else common[k]}"
                     for k in ("optimizer", "learning_rate", "rho", "economy") if k in common)
    dates = sorted({c["date"][:10] for c in cells})
    profiling = ", ".join(f"{_cell_name(s).split(',')[0]} {p['profiling_wall_s']:.0f} s"
                          for s, p in profiles.values())
    return "\n".join([
        _table(["model", "steps", "full step", "wall clock / full's (estimate)", "step ratio",
                "overhead", "tensors", "best accuracy, full / elastic"], rows), "",
        f"{_ran('bench_runtime.py', cells[0]['machine'], ' to '.join(dates))}: `{flags}`.  "
        f"Profiling took {profiling} (docs/performance.md has the timing tables)."])


def _over_seeds(rows, reference):
    """Each run of `rows` that has a rho, over its seeds, in order: (run, rho, its finished
    rows, their mean points under the same seed's `reference` row (seed -> row); None when
    every seed was refused)."""
    for run, rho in dict.fromkeys((r["run"], r["rho"]) for r in rows if r["rho"] is not None):
        done = [r for r in rows if (r["run"], r["rho"]) == (run, rho) and "error" not in r]
        under = _mean(reference[r["seed"]]["best"] - r["best"] for r in done
                      if r["seed"] in reference)
        yield run, rho, done, under


def readme_bench_prefix_cache(figures):
    """The frozen prefix cached: the smallcnn setting's elastic runs per rho and cache setting
    over the seeds against full training, and ResNet50's last stage when the figures have it."""
    d = _load("bench_prefix_cache", figures)
    rows = d["results"]["smallcnn"]
    full = {r["seed"]: r for r in rows if r["run"] == "full training"}
    seeds = sorted(full)
    body = []
    for run, rho, done, under in _over_seeds(rows, full):
        if not done:
            body.append([run, f"{rho:g}", "refused: below the forward floor", "", ""])
            continue
        ratio = _mean(r["step_ratio"] for r in done)
        body.append([run, f"{rho:g}",
                     f"{_mean(r['best'] for r in done):.1f}% ({_points(under)})",
                     f"{_mean(r['time_ratio'] for r in done):.2f}",
                     "" if ratio is None else f"{ratio:.2f}"])
    table = _table(
        [f"The smallcnn setting, seeds {seeds[0]}-{seeds[-1]} (full training "
         f"{_mean(r['best'] for r in full.values()):.1f}%)", "rho",
         "best accuracy (under full's)", "time / full's", "step ratio"], body)
    notes = []
    flip = d["results"].get("flip")
    if flip:
        errors = [r["relative_error"] for r in flip if r["relative_error"] > 0]
        notes.append(f"A flip applied at a cut instead of the image is "
                     f"{100 * min(errors):.0f}-{100 * max(errors):.0f}% of the activation "
                     f"away from the flipped image's prefix output")
    fit = d["results"].get("fit")
    if fit:
        notes.append(_fit_note(fit))
    last = next((r for r in d["results"].get("resnet50", {}).get("rows", [])
                 if r["selection"].startswith("last")), None)
    if last:
        notes.append(f"ResNet50's last stage steps at {last['cached_ratio']:.2f} of a full "
                     f"step cached, {last['uncached_ratio']:.2f} without")
    return "\n".join([
        table, "",
        f"{_ran('bench_prefix_cache.py', d['machine'], d['date'])}: the smallcnn setting "
        "(smallcnn from `--weights synthetic`, 64 px, Adam) with "
        "`--cache_frozen_prefix false` (off, the paper's protocol), `--cache_views K` (viewsK: "
        "K augmented views of each image; views2 is what the default, auto, keeps here) or "
        "`--cache_dtype float16` too (_fp16)." + "".join(f"  {n}." for n in notes)])


def _fit_note(rows):
    """The model.fit part in a sentence: each ElasticCallback row's mean best accuracy against
    plain fit's and its time, over the seeds."""
    plain = {r["seed"]: r for r in rows if r["rho"] is None}
    said = []
    for run, rho, done, under in _over_seeds(rows, plain):
        how = "cached" if "cache" in run else "uncached"
        if not done:
            said.append(f"rho {rho:g} {how} is refused (below the forward floor)")
            continue
        said.append(f"rho {rho:g} {how} ends {_points(under)} in "
                    f"{_mean(r['time_ratio'] for r in done):.2f} of its time")
    seeds = sorted(plain)
    return (f"A pretrained Keras 3 CNN in `model.fit`, seeds {seeds[0]}-{seeds[-1]}: plain fit "
            f"{_mean(r['best'] for r in plain.values()):.1f}%; ElasticCallback at "
            + ", ".join(said))


def readme_bench_keras(figures):
    """One architecture in each Keras: coverage, full step and step ratio, command line and
    model.fit."""
    import statistics

    d = _load("bench_keras", figures)
    rows, steps = [], {}
    for cell in d["cells"].values():
        for flavor, label in (("tf_keras", "tf-keras"), ("keras3", "Keras 3")):
            r = cell[flavor]
            p = r["profile"]
            ratios = [statistics.median(x["measured_ratio"] for x in r[key]
                                        if x["measured_ratio"] is not None)
                      for key in ("runs", "fit_runs")]
            name = (f"{_NAMES.get(cell['architecture'], cell['architecture'])}, "
                    f"{cell['input_size']} px, batch {cell['batch_size']}")
            steps.setdefault(name, {})[label] = p["full_step_ms"]
            rows.append([name, label, f"{100 * p['coverage']:.1f}%",
                         f"{p['full_step_ms']:.1f} ms", f"{ratios[0]:.3f} / {ratios[1]:.3f}"])
    shorter = [100 * (1 - s["tf-keras"] / s["Keras 3"]) for s in steps.values()]
    return "\n".join([
        _table(["architecture", "Keras", "op time attributed", "full step",
                f"step ratio at rho {d['rho']:g}, command line / model.fit"], rows), "",
        f"{_ran('bench_keras.py', d['machine'], d['date'])}: {_note('bench_keras', figures)}  "
        f"tf-keras's steps are {min(shorter):.0f}-{max(shorter):.0f}% shorter (its fused "
        "BatchNorm): the built-in models stay on it."])


def readme_memory(figures):
    """Peak memory of full training and an elastic run (the first setting benchmarked)."""
    group = next(iter(_load("memory", figures).values()))
    parts = []
    for r in group["rows"]:
        if r["run"] != "profiler.py alone":
            runs = r.get("rss_runs_mb") or [r["rss_mb"]]
            label = "full training" if r["run"] == "full" else f"ElasticTrainer at rho {r['rho']:g}"
            parts.append(f"{label} {r['rss_mb']:.0f} MB ({min(runs):.0f}-{max(runs):.0f})")
    model = group["rows"][0]["model"]
    return (f"{_NAMES.get(model, model)}: {', '.join(parts)}, each the median of its runs' "
            f"peaks (*`python scripts/bench_memory.py`: {group['settings']}*).")


# The paper's regime in README: the grid of today's defaults (full training, rho 0.5, --rho auto)
# and, below it, the fixed choices of tensors from the whole grid, whose runs do not select.
PAPER_NOW, PAPER_GRID = "bench_time_to_accuracy_paper_auto", "bench_time_to_accuracy_paper"
_FIXED = ("traditional_tl_training", "bn_plus_bias_training", "last stage")


def _shown(name):
    """Whether README shows grid row `name`: a numeric rho and the rate objective cache by
    default, so a row of theirs with views cached (--views_too) repeats the default's."""
    return "views cached" not in name or "share" in name


def readme_bench_time_to_accuracy_paper_auto(figures):
    """The paper's regime (mobilenetv2_paper): per scheme of PAPER_NOW, the median best
    accuracy, times to 95% of full training's best and to within 1 point of it (profiling
    included) with the speedups over full training's, and the whole run; the levels' noise and
    the fixed choices' best accuracies (PAPER_GRID) below."""
    from elastictrainer.method.schemes import SCHEMES

    def label(name):
        return SCHEMES[name].label if name in SCHEMES else name

    def level(v):
        if v["time_s"] is None:
            return "never"
        return f"{v['time_s']:.0f} s ({v['speedup']:.2f}x)"

    d = _load(PAPER_NOW, figures)
    c = d["configs"]["mobilenetv2_paper"]
    rows = [[label(name), f"{v['best_accuracy']:.1f}%", level(v["p95"]),
             level(v["pt1"]), f"{v['wall_clock_s']:.0f} s"] if "best_accuracy" in v else
            [label(name), "refused: below the forward floor", "", "", ""]
            for name, v in c["schemes"].items() if _shown(name)]
    seeds = d["args"]["other_seeds"]
    levels, st = c.get("levels") or {}, c["settings"]
    noise = (f" Full training's test accuracy moved {levels['spread']:.1f} points over its last "
             f"epoch (median over seeds)." if levels else "")
    grid = _load(PAPER_GRID, figures)
    full = grid["configs"]["mobilenetv2_paper"]["schemes"]
    fixed = [f"{label(name)} {v['best_accuracy']:.1f}%" for name, v in full.items()
             if name.startswith(_FIXED) and "best_accuracy" in v]
    fixed_line = (f" The fixed choices of tensors reach no level: {', '.join(fixed)} "
                  f"(`--out figures/{PAPER_GRID}`, {_machine(grid['machine'])}, "
                  f"{grid['date']}; the same settings).") if fixed else ""
    return "\n".join([
        _table([f"MobileNetV2, the paper's regime, median of seeds {','.join(map(str, seeds))}",
                "best accuracy", "to 95% of full's best (speedup)",
                "to within 1 point of it (speedup)", "whole run"], rows), "",
        f"{_ran('bench_time_to_accuracy.py', d['machine'], d['date'])}: `--configs "
        f"{','.join(d['args']['configs'])} --other_seeds {','.join(map(str, seeds))} --rhos "
        f"{','.join(f'{r:g}' for r in d['args']['rhos'])} --shares "
        f"{','.join(f'{x:g}' for x in d['args']['shares'])}"
        f"{''.join(f' --{k}' for k in ('rate', 'gain', 'elastic_only') if d['args'].get(k))}"
        f"{f' --views_too {v}' if (v := d['args'].get('views_too')) else ''}"
        f" --out "
        f"figures/{PAPER_NOW}`: MobileNetV2 from `--weights synthetic` at "
        f"{st['input_size']} px, batch {st['batch_size']}, SGD with momentum and cosine decay "
        f"at {st['learning_rate']:g} (a sweep of full training chose it), {st['epochs']} "
        f"epochs, {st['num_train']} training and {st['num_test']} test images, the default "
        f"cache (`--cache_frozen_prefix auto`: under `--rho auto`'s share objective none, "
        f"the input being augmented at random; 2 views cached: `--cache_frozen_prefix true`); "
        f"an elastic run's time includes its first profiling.{noise}{fixed_line}"])


README_BLOCKS = {
    "bench_readme_command": readme_command,
    "bench_distributed": readme_bench_distributed,
    "bench_runtime": readme_bench_runtime,
    "bench_prefix_cache": readme_bench_prefix_cache,
    "bench_keras": readme_bench_keras,
    "memory": readme_memory,
    PAPER_NOW: readme_bench_time_to_accuracy_paper_auto,
}


def readme_block(name, figures):
    """README.md's block `name`, rendered from figures/<name>.json."""
    return README_BLOCKS[name](figures) + "\n"
