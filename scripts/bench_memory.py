"""Peak memory of training runs: does an elastic run need less than full training?

Runs main.py once per cell of the matrix, each in its own process under `/usr/bin/time -v`, and
records the process's maximum resident set size (and summary.json's peak_rss_mb, the training
process's own view): full training, then elastic training at each rho with an existing timing
table and with no table (the run profiles first).  The table is written once by profiler.py,
whose own peak is recorded too.  Results are merged under --label into a JSON file and a markdown
table, so a "before" and an "after" matrix end up side by side.

    python scripts/bench_memory.py --models resnet50,mobilenetv2 --label after

--src runs another checkout's main.py and profiler.py (e.g. an export of the code before a
change) while writing results here.  Runs are sequential: one TensorFlow process at a time.
"""
import datetime
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from elastictrainer.experiments import perfdoc
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIME = "/usr/bin/time"


def build_parser():
    p = ArgumentParser(prog="bench_memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,mobilenetv2", type=comma_list(str, "names"),
                   help="comma-separated built-in model names")
    p.add_argument("--rhos", default="0.4,0.5,0.7", type=comma_list(float),
                   help="comma-separated rho values of the elastic runs")
    p.add_argument("--profile_first_rhos", default=None,
                   type=lambda t: () if t.strip().lower() == "none" else comma_list(float)(t),
                   help="rhos also run without a table, profiling first (default: --rhos; "
                        "none: no such run)")
    p.add_argument("--input_size", type=int, default=224, help="image height and width")
    p.add_argument("--batch_size", type=int, default=4, help="training batch size")
    p.add_argument("--num_epochs", type=int, default=3, help="epochs per run")
    p.add_argument("--steps_per_epoch", type=int, default=8, help="steps per epoch")
    p.add_argument("--interval", type=float, default=1, help="epochs between re-selections")
    p.add_argument("--tables", default=None, type=comma_list(str, "paths"),
                   help="existing timing tables, one per model in --models order: reused for "
                        "the runs that load a table, and profiler.py alone is not measured")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each cell, interleaved; a cell reports their median and range")
    p.add_argument("--label", default="after", help="name of this matrix (before, after, ...)")
    p.add_argument("--src", default=HERE, help="checkout whose main.py/profiler.py to run")
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    p.add_argument("--workdir", default=None, help="logs and tables (default: a temp dir)")
    p.add_argument("--out", default=os.path.join(HERE, "figures", "memory"),
                   help="output path without extension (.json and .md are written)")
    return p


def _tf_version(python):
    out = subprocess.run([python, "-c", "import tensorflow as tf; print(tf.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "unknown"


def measure(cmd, cwd, log_path):
    """Run `cmd` under /usr/bin/time -v; (max RSS MB, wall s, exit code)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([TIME, "-v"] + cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    with open(log_path) as f:
        text = f.read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return (int(m.group(1)) / 1024 if m else None), wall, proc.returncode


def run_matrix(args, log=functools.partial(print, flush=True)):
    work = args.workdir or tempfile.mkdtemp(prefix="et_mem_")
    os.makedirs(work, exist_ok=True)
    py, src = args.python, os.path.abspath(args.src)
    common = ["--input_size", str(args.input_size), "--batch_size", str(args.batch_size)]
    pf_rhos = args.rhos if args.profile_first_rhos is None else args.profile_first_rhos
    rows = []
    for i, model in enumerate(args.models):
        table = os.path.join(work, f"{model}.json")
        if args.tables and i < len(args.tables) and args.tables[i]:
            table = os.path.abspath(args.tables[i])
        cmd = [py, "profiler.py", "--model_name", model, "--num_classes", "10", "--output",
               table, "--figure", "", "--trace_dir", os.path.join(work, "traces", model),
               "--quiet"] + common
        if not os.path.exists(table):
            rss, wall, rc = measure(cmd, src, os.path.join(work, f"{model}_profiler.log"))
            rows.append({"model": model, "run": "profiler.py alone", "rho": None, "rss_mb": rss,
                         "summary_peak_mb": None, "wall_s": wall, "exit": rc,
                         "command": " ".join(cmd)})
            log(f"{model} profiler.py: {rss:.0f} MB, {wall:.0f} s, exit {rc}")
        cells = [("full", "full_training", 0.5, table)]
        cells += [("elastic, table", "elastic_training", r, table) for r in args.rhos]
        cells += [("elastic, profiles first", "elastic_training", r, None) for r in pf_rhos]
        # Repeats run interleaved (full, elastic, ..., full, elastic, ...): a process's peak
        # varies by tens of MB from run to run, so a cell is the median of its repeats and
        # a drift of the host over time falls on every cell alike.
        runs = {i: [] for i in range(len(cells))}
        for rep in range(args.repeats):
            for i, (what, train_type, rho, tab) in enumerate(cells):
                name = f"{model}_{train_type}_{rho:g}_{'table' if tab else 'profile'}_r{rep}"
                if tab is None:
                    tab = os.path.join(work, f"{name}_fresh.json")
                    if os.path.exists(tab):
                        os.remove(tab)
                cmd = [py, "main.py", "--model_name", model, "--weights", "none",
                       "--dataset_name", "synthetic", "--num_epochs", str(args.num_epochs),
                       "--steps_per_epoch", str(args.steps_per_epoch), "--interval",
                       f"{args.interval:g}", "--train_type", train_type, "--rho", f"{rho:g}",
                       "--optimizer", "sgd", "--logdir", os.path.join(work, "logs"),
                       "--run_name", name, "--timing_table", tab, "--quiet",
                       # uncached: the peak an elastic run holds against full training's
                       "--cache_frozen_prefix", "false"] + common
                if train_type != "full_training":
                    # the economy would train runs this short as full training: measure what
                    # an elastic run holds (its probe and selection steps)
                    cmd += ["--economy", "false"]
                rss, wall, rc = measure(cmd, src, os.path.join(work, f"{name}.log"))
                summary_path = os.path.join(work, "logs", name, "summary.json")
                peak = traces = None
                if os.path.exists(summary_path):
                    with open(summary_path) as f:
                        s = json.load(f)
                    peak, traces = s.get("peak_rss_mb"), s.get("step_cache_traces")
                runs[i].append({"rss_mb": rss, "summary_peak_mb": peak, "wall_s": wall,
                                "exit": rc, "step_cache_traces": traces,
                                "command": " ".join(cmd)})
                log(f"{model} {what} rho {rho:g} (repeat {rep + 1}/{args.repeats}): "
                    f"{rss:.0f} MB (summary {peak}), {wall:.0f} s, exit {rc}")
        for i, (what, _, rho, _) in enumerate(cells):
            rss = [r["rss_mb"] for r in runs[i] if r["rss_mb"]]
            peaks = [r["summary_peak_mb"] for r in runs[i] if r["summary_peak_mb"]]
            rows.append({"model": model, "run": what, "rho": None if what == "full" else rho,
                         "rss_mb": statistics.median(rss) if rss else None,
                         "rss_runs_mb": rss,
                         "summary_peak_mb": statistics.median(peaks) if peaks else None,
                         "exit": max(r["exit"] for r in runs[i]), "runs": runs[i]})
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def markdown(results):
    """One row per (model, run, rho), one column per label."""
    labels = list(results)
    keys = []
    for rows in results.values():
        for r in rows["rows"]:
            k = (r["model"], r["run"], r["rho"])
            if k not in keys:
                keys.append(k)
    lines = ["| model | run | rho | " + " | ".join(f"{lb} max RSS (MB)" for lb in labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    for k in keys:
        cells = []
        for lb in labels:
            hit = [r for r in results[lb]["rows"] if (r["model"], r["run"], r["rho"]) == k]
            cell = f"{hit[0]['rss_mb']:.0f}" if hit and hit[0]["rss_mb"] else ""
            runs = hit[0].get("rss_runs_mb", []) if hit else []
            if cell and len(runs) > 1:
                cell += f" ({min(runs):.0f}-{max(runs):.0f})"
            peak = hit[0].get("summary_peak_mb") if hit else None
            if cell and peak and abs(peak - hit[0]["rss_mb"]) > 5:
                cell += f", training process {peak:.0f}"
            cells.append(cell)
        rho = "" if k[2] is None else f"{k[2]:g}"
        lines.append(f"| {k[0]} | {k[1]} | {rho} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Max RSS is /usr/bin/time -v's: the largest of the run's processes, a profiling "
                 "child included; a cell is the median of its repeats, with their range in "
                 "parentheses; where summary.json's peak_rss_mb (the training process alone) "
                 "differs, it follows.")
    for lb in labels:
        lines.append(f"{lb}: {results[lb]['settings']}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = build_parser().parse_args(argv)
    rows = run_matrix(args)
    json_path, md_path = args.out + ".json", args.out + ".md"
    results = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            results = json.load(f)
    results[args.label] = {
        "settings": (f"{args.input_size} px, batch {args.batch_size}, {args.num_epochs} epochs x "
                     f"{args.steps_per_epoch} steps, interval {args.interval:g}, sgd, synthetic "
                     f"data, --weights none, elastic runs with --economy false, {args.repeats} "
                     f"repeats; /usr/bin/time -v maximum "
                     f"resident set size; {machine_text(machine_info(_tf_version(args.python)))}, "
                     f"{datetime.date.today().isoformat()}"),
        "src": os.path.abspath(args.src), "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(md_path, "w") as f:
        f.write(table)
    perfdoc.update_for(md_path)
    print(table, end="")
    print(f"wrote {json_path}, {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
