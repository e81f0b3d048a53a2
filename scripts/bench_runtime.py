"""What the elastic runtime costs: an elastic run's wall clock against full training's, per cell.

Usage (from the repo root):
    python scripts/bench_runtime.py [--cells smallcnn32_b8_500,...] [--rho 0.5] [--seed 0]
        [--logdir logs/bench_runtime] [--out figures/bench_runtime] [--profiles DIR] [--no_economy]
        [--quick] [--quiet]

Each cell of the grid (CELLS) trains full training and then elastic training with the same
settings, seed and steps, one after the other in this process, and reports:
  - the elastic run's training time over full training's, measured (the two summaries'
    train_time_s) and as the elastic run estimates it itself (summary.json wall_ratio: its own
    time over what its full steps measured would have taken; no full run needed);
  - the step-time ratio the elastic run measured (measured_ratio) against --rho;
  - the re-selection overhead (importance, timing full steps, compiling, solving) as a share of
    the elastic run's training time;
  - both runs' best test accuracy, the steps, full training's mean step time, and how many
    selections and closed-loop corrections the elastic run made.
The measured ratio and the run's estimate differ by what the estimate cannot see (the two runs
were apart in time: a load that came and went, a warmer process for the second run) and by
what it models loosely (the loop's own work is taken as equal in both).

Results go to --out .json (every number, both summaries, the machine and the date per cell) and
.md (one table).  Running some cells merges them with the cells already in the JSON file, so the
slow cell can run alone:
    python scripts/bench_runtime.py --cells resnet50_224_b4_500      # ~20+ min on 2 cores
The runs act on the step times they measure: run nothing else on the machine meanwhile (each
cell records the load average before and after).  Timing tables come from --profiles (default
the trainer's profiles/), profiled first when absent; --weights synthetic models are pretrained
once and cached in the Keras home.  Neither counts in train_time_s.  --quick shrinks every cell
to a few dozen steps of a tiny model (for tests; its results are stored as <cell>_quick).
"""
import dataclasses
import datetime
import functools
import json
import os

from elastictrainer.experiments import perfdoc
from elastictrainer.config import ArgumentParser, comma_list  # no TensorFlow: --help stays quick
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Settings shared by every cell (elastictrainer.config.Config fields).
COMMON = dict(dataset_name="synthetic", num_classes=10, resume=False)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One grid cell: Config fields (besides COMMON, --rho and --seed) and what it is for."""
    about: str
    settings: dict


# Synthetic training sets stay within the loader's in-memory budget (64 MB of 8-bit pixels)
# where the steps allow, so both runs read batches from memory rather than generating them in
# the loop; resnet50's 2000 images at 224 px are generated per batch (the same in both runs,
# and small beside its steps).
CELLS = {
    "smallcnn32_b8_500": Cell(
        "millisecond steps: the loop's own work and the runtime's fixed costs weigh most",
        dict(model_name="smallcnn", weights="synthetic", input_size=32, batch_size=8,
             num_train=4000, num_test=1024, num_epochs=1, interval=1, optimizer="adam",
             learning_rate=1e-3)),
    "smallcnn32_b8_2000": Cell(
        "the same steps four times as long: fixed costs spread over more steps, two selections",
        dict(model_name="smallcnn", weights="synthetic", input_size=32, batch_size=8,
             num_train=4000, num_test=1024, num_epochs=4, interval=2, optimizer="adam",
             learning_rate=1e-3)),
    "smallcnn64_b32_600": Cell(
        "the smallcnn setting's model and batch, 4 epochs of 150 steps",
        dict(model_name="smallcnn", weights="synthetic", input_size=64, batch_size=32,
             num_train=4800, num_test=1024, num_epochs=4, interval=2, optimizer="adam",
             learning_rate=1e-3)),
    "mobilenetv2_96_b8_500": Cell(
        "a deeper model (tens of ms a step), 2 epochs of 250 steps, one selection",
        dict(model_name="mobilenetv2", weights="synthetic", input_size=96, batch_size=8,
             num_train=2000, num_test=512, num_epochs=2, interval=2, optimizer="adam",
             learning_rate=1e-3)),
    "resnet50_224_b4_500": Cell(
        "the paper's model and input size, steps of hundreds of ms, from random weights",
        dict(model_name="resnet50", weights="none", input_size=224, batch_size=4,
             num_train=2000, num_test=512, num_epochs=1, interval=1, optimizer="sgd",
             learning_rate=1e-4)),
}

# --quick: each cell as a tiny model of QUICK_STEPS steps an epoch, two epochs (a re-selection
# at the second).
QUICK_STEPS = 24


def quick_settings(settings):
    small = settings["model_name"] == "smallcnn"
    batch = min(settings["batch_size"], 8)
    return dict(settings, weights="none", input_size=16 if small else 32, batch_size=batch,
                num_train=batch * QUICK_STEPS, num_test=32, num_epochs=2, interval=1)


def build_parser():
    ap = ArgumentParser(prog="bench_runtime.py", description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=None, type=comma_list(str, "cell names"),
                    help=f"cells to run, comma-separated, of: {', '.join(CELLS)} (default: all)")
    ap.add_argument("--rho", type=float, default=0.5, help="rho of the elastic runs")
    ap.add_argument("--seed", type=int, default=0, help="seed of both runs of every cell")
    ap.add_argument("--logdir", default="logs/bench_runtime", help="where the runs go")
    ap.add_argument("--out", default=os.path.join("figures", "bench_runtime"),
                    help="output path without extension (.json and .md are written)")
    ap.add_argument("--profiles", default=None,
                    help="folder of the timing tables (default: the trainer's, profiles/)")
    ap.add_argument("--no_economy", action="store_true",
                    help="elastic runs re-select and correct whatever the run's length (Config "
                         "economy false), as the paper does")
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny cells: {QUICK_STEPS} steps an epoch, 2 epochs, no pretrained "
                         f"weights (for tests)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


# ----------------------------------------------------------------------------------- machine
def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------------- numbers
def steps_of(summary):
    return summary["steps_per_epoch"] * len(summary["epochs"])


def derive(full, elastic, rho):
    """The cell's numbers from its two summaries (module doc)."""
    steps = steps_of(full)
    if steps_of(elastic) != steps:
        raise RuntimeError(f"the runs trained different steps: full {steps}, elastic "
                           f"{steps_of(elastic)}")
    overhead = elastic["reselection_overhead_s"] or 0.0
    train = elastic["train_time_s"]
    return {
        "steps": steps,
        "full_train_time_s": full["train_time_s"],
        "elastic_train_time_s": train,
        "full_step_ms": 1e3 * full["train_time_s"] / steps,
        "elastic_step_ms": 1e3 * train / steps,
        "wall_ratio_measured": train / full["train_time_s"],
        "wall_ratio_estimated": elastic["wall_ratio"],
        "rho": rho,
        "measured_step_ratio": elastic["measured_ratio"],
        "overhead_s": overhead,
        "overhead_share": overhead / train if train > 0 else None,
        "overhead_parts_s": dict(elastic["reselection_overhead_parts_s"] or {}),
        "best_accuracy_full": full["best_test_accuracy"],
        "best_accuracy_elastic": elastic["best_test_accuracy"],
        "selections": len(elastic["selections"]),
        "selected_tensors": [sum(s["mask"]) for s in elastic["selections"]],
        "selection_reasons": [s["reason"] for s in elastic["selections"]],
        "corrections": len(elastic["corrections"]),
        "num_tensors": elastic["num_tensors"],
        "forward_floor": (elastic["plan"] or {}).get("forward_floor"),
        "affordable_tensors": (elastic["plan"] or {}).get("affordable_tensors"),
    }


def profile_record(path):
    """What the profiler measured for a cell's model (the timing table its elastic run used,
    as summary.json names it), or None."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        t = json.load(f)
    cal = t.get("calibration") or {}
    return {"path": path, "tensors": len(t["tensors"]),
            "estimated": sum(bool(x.get("estimated")) for x in t["tensors"]),
            "coverage": t.get("coverage"), "t_fp_ms": t["t_fp_ms"], "t_full_ms": t["t_full_ms"],
            "t_grads_ms": t.get("t_grads_ms"), "compile_ms": t.get("compile_ms"),
            "dw_scale": cal.get("dw_scale"), "dy_scale": cal.get("dy_scale"),
            "fixed_ms": cal.get("fixed_ms"), "profiling_wall_s": t.get("profiling_wall_s")}


def profile_row(name, p):
    return (f"| {name} | {p['tensors']} ({p['estimated']} estimated) | "
            f"{_num(p['coverage'] and 100 * p['coverage'], '.1f')}% | {p['t_full_ms']:.1f} | "
            f"{p['t_fp_ms'] / p['t_full_ms']:.2f} | "
            f"{_num(p['t_grads_ms'] and p['t_full_ms'] / p['t_grads_ms'], '.3f')} | "
            f"x{_num(p['dw_scale'], '.2f')}, x{_num(p['dy_scale'], '.2f')}, "
            f"{_num(p['fixed_ms'], '+.1f')} ms | {_num(p['compile_ms'], '.0f')} | "
            f"{_num(p['profiling_wall_s'], '.0f')} |")


def run_cell(name, settings, args, log):
    """Full training, then elastic training, of one cell; its JSON entry."""
    from elastictrainer.runs import loop
    from elastictrainer.config import Config
    from elastictrainer.profiler.table import default_table_path

    base = dict(COMMON, **settings, rho=args.rho, seed=args.seed, logdir=args.logdir,
                economy=not args.no_economy, progress=not args.quiet)
    if args.profiles:
        base["timing_table"] = default_table_path(
            base["model_name"], base["input_size"], base["batch_size"], base["num_classes"],
            optimizer=base["optimizer"], folder=args.profiles)
    load_before = load_average()
    started = datetime.datetime.now().isoformat(timespec="seconds")
    summaries = {}
    for train_type in ("full_training", "elastic_training"):
        cfg = Config(**base, train_type=train_type,
                     run_name=f"{name}_{train_type.split('_')[0]}")
        cfg.validate()
        log(f"== {name}: {train_type} ({settings['model_name']}, input {settings['input_size']}, "
            f"batch {settings['batch_size']}, {settings['num_epochs']} epoch(s))")
        summaries[train_type] = loop.run(cfg, log=log)
        if summaries[train_type]["status"] != "finished":
            raise RuntimeError(f"{name} {train_type} ended {summaries[train_type]['status']}: "
                               f"{summaries[train_type].get('error')}")
    full, elastic = summaries["full_training"], summaries["elastic_training"]
    return {"settings": dict(base), "date": started, "machine": machine_info(),
            "load_average": {"before": load_before, "after": load_average()},
            "results": derive(full, elastic, args.rho),
            "profile": profile_record(elastic["timing_table"]),
            "summaries": {"full": full, "elastic": elastic}}


# ----------------------------------------------------------------------------------- tables
def _num(value, fmt):
    return "n/a" if value is None else format(value, fmt)


def _acc(value):
    return "n/a" if value is None else f"{value:.1f}%"


def parts_text(parts):
    return ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()) or "none"


def row(name, r):
    share = "n/a" if r["overhead_share"] is None else f"{100 * r['overhead_share']:.1f}%"
    return (f"| {name} | {r['steps']} | {r['full_step_ms']:.1f} | "
            f"{r['wall_ratio_measured']:.3f} | {_num(r['wall_ratio_estimated'], '.3f')} | "
            f"{_num(r['measured_step_ratio'], '.3f')} ({r['rho']:g}) | {share} | "
            f"{parts_text(r['overhead_parts_s'])} | "
            f"{_acc(r['best_accuracy_full'])} / {_acc(r['best_accuracy_elastic'])} | "
            f"{r['selections']} / {r['corrections']} |")


def machine_cores(cells):
    cores = sorted({str(c["machine"].get("cores")) for c in cells.values()})
    return "/".join(cores)


def markdown(cells):
    """The table of every cell, headed by the machine(s) and the date(s) they ran on."""
    names = sorted(cells, key=lambda n: (list(CELLS).index(n.removesuffix("_quick"))
                                         if n.removesuffix("_quick") in CELLS else len(CELLS), n))
    machines = {}
    for n in names:
        machines.setdefault(machine_text(cells[n]["machine"]), []).append(n)
    dates = sorted(cells[n]["date"][:10] for n in names)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    if len(machines) == 1:
        head = [f"Machine: {next(iter(machines))}; run {when}."]
    else:
        head = [f"Run {when} on:"] + [f"- {m}: {', '.join(ns)}" for m, ns in machines.items()]
    lines = head + [
        "",
        "| cell | steps | full step ms | elastic/full wall clock, measured | run's estimate | "
        "measured step ratio (rho) | overhead % of training | overhead parts | "
        "best acc full / elastic | selections / corrections |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ] + [row(n, cells[n]["results"]) for n in names] + [
        "",
        "Both runs of a cell have the same settings, seed and steps, full training first, in one "
        "process.  Measured: the elastic run's train_time_s over full training's.  Run's "
        "estimate: the elastic run's wall_ratio, from its own timed full steps.  Overhead: "
        "reselection_overhead_s (importance, timing full steps, compiling, solving) over the "
        "elastic run's train_time_s.  Settings, load averages and both summaries per cell are "
        "in the .json file.",
    ]
    loads = [f"{n} {cells[n]['load_average']['before'][0]:.1f} -> "
             f"{cells[n]['load_average']['after'][0]:.1f}"
             for n in names if cells[n].get("load_average")]
    if loads:
        lines += ["", f"Load average (1 min) before -> after each cell, on {machine_cores(cells)} "
                      f"cores: " + "; ".join(loads) + ".  Above the core count, other work shared "
                      "the machine: the two runs' measured ratio then carries the load's changes, "
                      "while the run's estimate times its full steps in the same minutes as its "
                      "own."]
    profiled = [n for n in names if cells[n].get("profile")]
    if profiled:
        lines += [
            "",
            "The timing tables the cells used (profiler.py on the same machine; a table "
            "profiled once serves every cell with its model, input size and batch):",
            "",
            "| cell | tensors | coverage | full step ms | forward / full | full / no-update "
            "step | calibration: t_dw, t_dy scales, fixed cost | compile ms | profiling s |",
            "|---|---|---|---|---|---|---|---|---|",
        ] + [profile_row(n, cells[n]["profile"]) for n in profiled]
    return "\n".join(lines) + "\n"


def read_cells(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get("cells", {})


def write(out, cells):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    text = markdown(cells)
    tmp = out + ".json.tmp"
    with open(tmp, "w") as f:
        json.dump({"cells": cells}, f, indent=1)
    os.replace(tmp, out + ".json")
    with open(out + ".md", "w") as f:
        f.write(text)
    perfdoc.update_for(out + ".md")
    return text


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    args.cells = args.cells or tuple(CELLS)
    unknown = [c for c in args.cells if c not in CELLS]
    if unknown:
        ap.error(f"unknown cell(s) {', '.join(unknown)}; valid: {', '.join(CELLS)}")
    if not 0 < args.rho <= 1:
        ap.error(f"--rho must be in (0, 1], got {args.rho}")
    out = os.path.splitext(args.out)[0] if args.out.endswith((".json", ".md")) else args.out
    log = functools.partial(print, flush=True)
    from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

    for name in args.cells:
        settings = CELLS[name].settings
        key = name
        if args.quick:
            settings, key = quick_settings(settings), name + "_quick"
        entry = run_cell(key, settings, args, log)
        # merged with what the file holds now, so cells run apart (or concurrently) all stay
        cells = read_cells(out + ".json")
        cells[key] = entry
        text = write(out, cells)
        r = entry["results"]
        log(f"== {key}: elastic/full wall clock {r['wall_ratio_measured']:.3f} measured, "
            f"{_num(r['wall_ratio_estimated'], '.3f')} estimated; step ratio "
            f"{_num(r['measured_step_ratio'], '.3f')} (rho {args.rho:g}); overhead "
            f"{r['overhead_s']:.1f} s of {r['elastic_train_time_s']:.1f} s")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
