"""Several schemes on the same settings, one after the other, and one side-by-side table (such as
full training, ElasticTrainer and traditional TL fine-tuning the same pretrained model).  Runs
are named RUN_NAME_<train_type>; a finished one is read, not run again, when it ran with the same
settings (one of other settings, such as another --rho, is refused in one line rather than shown
as this one), and an interrupted one continues from its checkpoint; --resume false trains them
all over."""
import dataclasses
import os

from elastictrainer import runlog
from elastictrainer.experiments import recorded
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.plotting.time_to_accuracy import profiling_offset

COMPARE_FILE = "compare.md"
# what the user does about a finished run of other settings under the same name
OTHER_RUN = "pass another --run_name, or --resume false to train it again"
# The best epoch follows epoch-to-epoch swings (3-5 points in the smallcnn setting under Adam's
# constant rate, more for the schemes that train fewer tensors), so the table also gives the
# mean of the last few epochs: how well each scheme ends, not only its luckiest epoch.
LAST_EPOCHS = 3


def compare(cfg, train_types, log=print):
    """Run `cfg` once per train type (in this process); returns the table's rows."""
    from elastictrainer.runs.loop import run

    for name in train_types:
        SCHEMES.get_or_fail(name)
    prefix = cfg.run_name or "compare"
    rows = []
    for name in train_types:
        run_cfg = dataclasses.replace(cfg, train_type=name, run_name=f"{prefix}_{name}")
        out = runlog.run_dir(cfg.logdir, run_cfg.run_name)
        summary = recorded.finished_run(run_cfg, remedy=OTHER_RUN) if cfg.resume else None
        if summary is None:
            log(f"--- {name} ({out})")
            summary = run(run_cfg, log=log)
        else:
            log(f"--- {name}: finished before, read from {out}")
        rows.append(summary)
    return rows


def last_epochs_accuracy(summary, n=LAST_EPOCHS):
    """Mean test accuracy (%) of the run's last `n` tested epochs; None before the first."""
    accs = [e["test_accuracy"] for e in summary["epochs"][-n:]]
    return sum(accs) / len(accs) if accs else None


def table(rows):
    """Markdown: best accuracy and the last epochs' mean, training time, its ratio to full
    training's, measured ratio; below it, the first profiling a run paid before training,
    which its training time leaves out."""
    full = next((r for r in rows if r["train_type"] == "full_training"), None)
    lines = ["| scheme | rho | best test accuracy | mean of the last "
             f"{LAST_EPOCHS} epochs | training time | time / full training's | "
             "measured step ratio | tensors trained (last epoch) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['train_time_s'] / full['train_time_s']:.2f}"
                 if full and full["train_time_s"] else "")
        measured = r.get("measured_ratio")
        last = r["epochs"][-1]["selected"] if r["epochs"] else 0
        ending = last_epochs_accuracy(r)
        lines.append(
            f"| {SCHEMES[r['train_type']].label} | {'' if r['rho'] is None else r['rho']} | "
            f"{max(r['best_test_accuracy'] or 0.0, 0.0):.1f}% | "
            f"{'' if ending is None else f'{ending:.1f}%'} | {r['train_time_s']:.1f} s | "
            f"{ratio} | {'' if measured is None else f'{measured:.2f}'} | "
            f"{last}/{r['num_tensors']} |")
    # a run that profiled its timing table before training: not in its training time
    profiled = [(SCHEMES[r["train_type"]].label, profiling_offset(r)) for r in rows
                if profiling_offset(r)]
    if profiled:
        lines += ["", "Training time leaves out the timing table's first profiling ("
                  + ", ".join(f"{label}: {s:.1f} s" for label, s in profiled)
                  + "); each run's closing line gives its wall clock against full training's "
                    "with it."]
    return "\n".join(lines)


def write_table(rows, logdir, prefix):
    path = os.path.join(logdir, f"{prefix}_{COMPARE_FILE}")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(table(rows) + "\n")
    os.replace(tmp, path)
    return path
