"""What rho affords, trained without re-selecting: the smallcnn setting with fixed selections.

Usage (from the repo root; figures/bench_fixed_selection.{json,md} came from `--first 12`
started with no timing table under profiles/, so that seed 0's elastic run profiles in its
process after full training, as compare.py does in a fresh clone; about 14 min on 2
cores):
    python scripts/bench_fixed_selection.py [--seeds 0,1,2,3,4] [--first 13,12]
        [--logdir logs/bench_fixed_selection] [--out figures/bench_fixed_selection.json]

For every seed it runs the smallcnn setting (smallcnn fine-tuned from --weights synthetic
on the synthetic data, Adam 1e-3, 12 epochs) with full training, with a fixed selection "tensor
k to the output" for every k in --first (trained for the whole run, never re-selected: what an
elastic run could reach if it always trained those tensors), and with elastic_training at
--rho.  Two tables give each run's best test accuracy, and its mean test accuracy over the last
3 epochs (how it ends; compare.LAST_EPOCHS), with the points it is under full training's, per
seed and on average; the JSON also holds how far each run's test accuracy moved per epoch from
epoch 5 on.  With the default --first 13,12 (the 32-48-64 smallcnn, on a 2-core AVX-512
machine): tensors 13-19 are the last stage and the head without the stage's first conv kernel,
12-19 the whole last stage; they are the selections rho 0.5 affords (they measured 0.47-0.49
and 0.47-0.52 of a full step in elastic runs), so the gap they leave is the one rho 0.5 leaves
in this task, whatever the selector does.  Deeper selections (--first 9 or 6) show where the
remaining points are, at a step cost rho 0.5 does not allow.  On another machine, rho 0.5 may
afford other selections: the elastic run's start line says how many tensors it affords.

Finished runs in --logdir are read, not run again (compare.compare); run nothing else on the
machine meanwhile, since the elastic runs act on the step times they measure.
"""
import dataclasses
import json
import os
import datetime
import statistics

from elastictrainer.experiments import perfdoc
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.machine import machine_info, machine_text
from elastictrainer.experiments.compare import LAST_EPOCHS, compare, last_epochs_accuracy
from elastictrainer.method.schemes import register_fixed_from  # no TensorFlow: --help stays quick

# the smallcnn setting, without --rho (given by --rho)
SMALLCNN = ("--model_name smallcnn --weights synthetic --dataset_name synthetic --num_train 4800 "
             "--num_test 1024 --input_size 64 --batch_size 32 --optimizer adam "
             "--learning_rate 0.001")


def _points(x):
    """Points to one place, a mean that rounds to zero printed as 0.0, not -0.0."""
    return f"{round(x, 1) + 0.0:.1f}"


def build_parser():
    ap = ArgumentParser(prog="bench_fixed_selection.py", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", type=comma_list(int, "integers"),
                    help="seeds, comma-separated")
    ap.add_argument("--first", default="13,12", type=comma_list(int, "integers"),
                    help="fixed selections: tensor k to the output, for each k given")
    ap.add_argument("--rho", type=float, default=0.5, help="rho of the elastic runs")
    ap.add_argument("--no_elastic", action="store_true", help="skip the elastic runs")
    ap.add_argument("--logdir", default="logs/bench_fixed_selection", help="where runs go")
    ap.add_argument("--out", default="figures/bench_fixed_selection.json",
                    help="JSON results; a Markdown table is written beside it (.md)")
    return ap


# the fixed selections' scheme (method.schemes.FixedFrom), under the name the tests use
register_fixed = register_fixed_from


# Beside each run's best epoch, the measures of how it ends (compare.LAST_EPOCHS) and how much it
# swings: the mean change of test accuracy from one epoch to the next, from epoch SWING_FROM on
# (1-based; the first epochs still climb).
LAST = "mean of the last epochs"
SWING = "points moved per epoch"
SWING_FROM = 5
STEP_RATIO, TIME_RATIO = "elastic measured_ratio", "elastic time / full's"


def swing(summary, first_epoch=SWING_FROM):
    """Mean absolute change of test accuracy between consecutive epochs from `first_epoch` on."""
    accs = [e["test_accuracy"] for e in summary["epochs"][first_epoch - 1:]]
    moves = [abs(b - a) for a, b in zip(accs, accs[1:])]
    return statistics.mean(moves) if moves else None


def table(results, firsts, elastic, measure=None):
    """Per seed, each run's best accuracy (or its `measure`: LAST) and the points it is under
    full training's, and the mean."""
    cols = ["full training"] + [f"tensors {k}- fixed" for k in firsts] + (
        ["ElasticTrainer"] if elastic else [])
    extra = ["ElasticTrainer's time / full training's", "its measured step ratio"] if elastic else []
    lines = ["| seed | " + " | ".join(cols + extra) + " |",
             "|---" * (len(cols) + len(extra) + 1) + "|"]
    gaps = {c: [] for c in cols[1:]}
    for r in results:
        value = r if measure is None else r[measure]
        full = value["full training"]
        cells = [f"{full:.1f}%"]
        for c in cols[1:]:
            gap = full - value[c]
            gaps[c].append(gap)
            cells.append(f"{value[c]:.1f}% ({abs(gap):.1f} {'under' if gap >= 0 else 'over'})")
        if extra:
            cells += [f"{r[TIME_RATIO]:.2f}", f"{r[STEP_RATIO]:.3f}"]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
    if len(results) > 1:
        lines.append("| mean points under full training (negative: over) | | " + " | ".join(
            f"{_points(statistics.mean(gaps[c]))} ({_points(min(gaps[c]))} to "
            f"{_points(max(gaps[c]))})"
            for c in cols[1:]) + " |" + "".join(
            f" {statistics.mean(r[k] for r in results):.2f} ({min(r[k] for r in results):.2f} to "
            f"{max(r[k] for r in results):.2f}) |" for k in (TIME_RATIO, STEP_RATIO) if extra))
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    from elastictrainer import cli

    elastic = not args.no_elastic
    names = [register_fixed(k) for k in args.first]
    train_types = ["full_training"] + names + (["elastic_training"] if elastic else [])
    results = []
    for seed in args.seeds:
        cfg = cli.config_from_args(cli.train_parser().parse_args(
            SMALLCNN.split() + ["--rho", str(args.rho), "--seed", str(seed), "--quiet",
                                 "--logdir", args.logdir]))
        cfg = dataclasses.replace(cfg, run_name=f"seed{seed}")
        rows = {r["train_type"]: r for r in compare(cfg, train_types)}
        runs = {"full training": rows["full_training"]}
        runs.update({f"tensors {k}- fixed": rows[name] for k, name in zip(args.first, names)})
        if elastic:
            runs["ElasticTrainer"] = rows["elastic_training"]
        entry = {"seed": seed, **{c: r["best_test_accuracy"] for c, r in runs.items()},
                 LAST: {c: last_epochs_accuracy(r) for c, r in runs.items()},
                 SWING: {c: swing(r) for c, r in runs.items()}}
        if elastic:
            e = rows["elastic_training"]
            entry.update({STEP_RATIO: e["measured_ratio"],
                          TIME_RATIO: e["train_time_s"] / rows["full_training"]["train_time_s"]})
        results.append(entry)
        print(json.dumps(entry), flush=True)
    when = datetime.date.today().isoformat()
    text = (f"Machine: {machine_text(machine_info())}; run {when}. Command: `{SMALLCNN}` "
            f"with `--rho {args.rho:g} --seed S`.\n\n"
            f"Best test accuracy\n\n{table(results, args.first, elastic)}\n\n"
            f"Mean test accuracy of the last {LAST_EPOCHS} epochs\n\n"
            f"{table(results, args.first, elastic, LAST)}")
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "command": SMALLCNN, "machine": machine_info(),
                   "date": when,
                   "last_epochs": LAST_EPOCHS, "swing_from_epoch": SWING_FROM,
                   "results": results}, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(text + "\n")
    perfdoc.update_for(os.path.splitext(args.out)[0] + ".md")


if __name__ == "__main__":
    main()
