"""README command 1 as a newcomer runs it: a fresh clone, the command line as the README prints
it, timed whole.

Usage (from the repo root; figures/bench_readme_command.{json,md} came from the defaults, run
with nothing else on the machine, since the elastic run acts on the step times it measures):
    python scripts/bench_readme_command.py [--seeds 0,1,2] [--venv]
        [--logdir logs/bench_readme_command] [--out figures/bench_readme_command]

For every seed, `git clone` of this repository's HEAD into a temporary directory (so no timing
table, no logs, no cached prefix: the elastic run profiles first, in its process, as in a fresh
clone), then README command 1's compare.py line, with `--seed S` for every seed but 0, run there
by this interpreter and timed from start to exit: full training, ElasticTrainer and traditional
TL, each trained and tested for its epochs, and the first profiling.  With --venv the first
seed's clone also runs the command's set-up part (`python3 -m venv .venv && .venv/bin/pip
install -r requirements.txt -e .`), timed apart, and runs the command with that venv's Python.
Each clone's logs are copied to --logdir/seedS and what it printed to --logdir/seedS.out; a
seed already in --out's JSON, from this machine and the same command, is read back, not run
again.

The table gives, per scheme and seed: best test accuracy, the mean of the last epochs, training
time and its ratio to full training's, the measured step ratio and the tensors trained; beside
it full training's epoch-to-epoch spread over its last epochs (time_to_accuracy.noise, as the
time-to-accuracy benchmark gives it), the noise a difference between schemes must stand above.
"""
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from elastictrainer import runlog  # no TensorFlow: --help stays quick
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.experiments import perfdoc
from elastictrainer.experiments.compare import LAST_EPOCHS, last_epochs_accuracy
from elastictrainer.experiments.recorded import same_machine
from elastictrainer.experiments.time_to_accuracy import noise
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository cloned

# README command 1 after `.venv/bin/python ` (test_perfdoc checks the README prints exactly this)
COMMAND = ("compare.py --model_name efficientnet_lite0 --weights imagenet "
           "--dataset_name synthetic_textures --num_train 1500 --num_test 4096 --input_size 96 "
           "--batch_size 8 --optimizer sgd --learning_rate 0.01 --num_epochs 8 "
           "--bn_mode frozen --rho 0.5")
# its set-up part, before ` && .venv/bin/python `
SETUP = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt -e ."
SCHEMES = (("full_training", "Full training"), ("elastic_training", "ElasticTrainer"),
           ("traditional_tl_training", "Traditional TL"))


def build_parser():
    ap = ArgumentParser(prog="bench_readme_command.py", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", type=comma_list(int, "integers"),
                    help="seeds, comma-separated (0 is the README's own command)")
    ap.add_argument("--venv", action="store_true",
                    help="the first seed's clone also creates its venv and installs (timed)")
    ap.add_argument("--logdir", default="logs/bench_readme_command",
                    help="where each clone's logs are copied (seedS)")
    ap.add_argument("--out", default="figures/bench_readme_command",
                    help="results: OUT.json and OUT.md")
    return ap


def command_for(seed):
    return COMMAND + ("" if seed == 0 else f" --seed {seed}")


def scheme_row(summary, full):
    """One scheme's numbers from its run's summary.json (`full`: full training's)."""
    last = summary["epochs"][-1] if summary["epochs"] else {}
    return {"best": summary["best_test_accuracy"], "last": last_epochs_accuracy(summary),
            "train_s": summary["train_time_s"],
            "time_ratio": summary["train_time_s"] / full["train_time_s"],
            "measured_ratio": summary.get("measured_ratio"),
            "selected": last.get("selected"), "tensors": summary["num_tensors"],
            "accuracy": [e["test_accuracy"] for e in summary["epochs"]]}


def read_runs(logs):
    """{scheme label: row} from a finished command's logs directory."""
    summaries = {name: runlog.read_summary(runlog.run_dir(logs, f"compare_{name}"))
                 for name, _ in SCHEMES}
    full = summaries["full_training"]
    return {label: scheme_row(summaries[name], full) for name, label in SCHEMES}


def run_seed(seed, venv, logdir, log=print):
    """Clone, (set up,) run the command; the seed's entry."""
    with tempfile.TemporaryDirectory(prefix="readme_command_") as tmp:
        clone = os.path.join(tmp, "clone")
        subprocess.run(["git", "clone", "-q", HERE, clone], check=True)
        entry = {"seed": seed, "command": command_for(seed), "setup_s": None}
        python = sys.executable
        if venv:
            start = time.perf_counter()
            subprocess.run(SETUP, shell=True, cwd=clone, check=True, stdout=subprocess.DEVNULL)
            entry["setup_s"] = time.perf_counter() - start
            python = os.path.join(clone, ".venv", "bin", "python")
        log(f"seed {seed}: {python} {entry['command']}  (in {clone})")
        os.makedirs(logdir, exist_ok=True)
        with open(os.path.join(logdir, f"seed{seed}.out"), "w") as printed:
            start = time.perf_counter()
            subprocess.run([python] + entry["command"].split(), cwd=clone, check=True,
                           stdout=printed, stderr=subprocess.STDOUT)
            entry["command_s"] = time.perf_counter() - start
        entry["schemes"] = read_runs(os.path.join(clone, "logs"))
        target = os.path.join(logdir, f"seed{seed}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(os.path.join(clone, "logs"), target)
    return entry


def table(results):
    """Markdown: per seed and scheme, the command's numbers."""
    head = ["seed", "scheme", "best test accuracy", f"mean of the last {LAST_EPOCHS} epochs",
            "training time", "time / full training's", "measured step ratio",
            "tensors trained (last epoch)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in results:
        for label, s in r["schemes"].items():
            ratio = s["measured_ratio"]
            lines.append(
                f"| {r['seed']} | {label} | {s['best']:.1f}% | {s['last']:.1f}% | "
                f"{s['train_s']:.1f} s | {s['time_ratio']:.2f} | "
                f"{'' if ratio is None else f'{ratio:.2f}'} | {s['selected']}/{s['tensors']} |")
    return "\n".join(lines)


def summary_line(results):
    """The seeds in one sentence: ElasticTrainer's points under full training, its time, the
    command's wall clock, full training's spread."""
    under = [r["schemes"]["Full training"]["best"] - r["schemes"]["ElasticTrainer"]["best"]
             for r in results]
    times = [r["schemes"]["ElasticTrainer"]["time_ratio"] for r in results]
    # the time-to-accuracy benchmark's noise: full training's spread over its last epochs
    levels = noise([list(enumerate(r["schemes"]["Full training"]["accuracy"]))
                    for r in results])
    minutes = [r["command_s"] / 60 for r in results]
    setup = [r["setup_s"] for r in results if r["setup_s"] is not None]
    seeds = [r["seed"] for r in results]
    text = (f"Seeds {min(seeds)}-{max(seeds)}: ElasticTrainer's best "
            f"{statistics.mean(under):.1f} points under full training's "
            f"({min(under):.1f} to {max(under):.1f}) in {statistics.mean(times):.2f} of its "
            f"training time; full training's test accuracy moves by "
            f"{levels['spread']:.1f} points over its last {levels['epochs']} epochs "
            f"(median). The command took {statistics.mean(minutes):.1f} min "
            f"({min(minutes):.1f} to {max(minutes):.1f})")
    if setup:
        text += f", its set-up {setup[0] / 60:.1f} min more"
    return text + "."


def load(out, machine):
    """The results already measured on this machine for this command, or []."""
    try:
        with open(out + ".json", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return []
    if d.get("command") != COMMAND or not same_machine(d.get("machine"), machine):
        return []
    return d["results"]


def main(argv=None):
    args = build_parser().parse_args(argv)
    machine = machine_info()
    results = load(args.out, machine)
    done = {r["seed"] for r in results}
    when = None  # every seed read back: the results keep the date they were measured on
    for i, seed in enumerate(args.seeds):
        if seed in done:
            print(f"seed {seed}: read back from {args.out}.json")
            continue
        results.append(run_seed(seed, args.venv and i == 0, args.logdir))
        results.sort(key=lambda r: r["seed"])
        when = datetime.date.today().isoformat()
        write(args, machine, results, when)
    if when is None:
        print(f"every seed was read back from {args.out}.json, nothing written (remove it to "
              f"measure again)")
        return
    write(args, machine, results, when)


def write(args, machine, results, when):
    text = (f"Machine: {machine_text(machine)}; {when}. README command 1 in a fresh clone: "
            f"`.venv/bin/python {COMMAND}` (with `--seed S` for seeds other than 0).\n\n"
            f"{table(results)}\n\n{summary_line(results)}\n")
    print(text)
    perfdoc.write_benchmark(args.out, {"command": COMMAND, "machine": machine, "date": when,
                                       "last_epochs": LAST_EPOCHS, "results": results}, text)


if __name__ == "__main__":
    main()
