"""The offline figures' table (`elastictrainer figure FIG --offline`): per model and scheme, our
best test accuracy and training time as the difference to full training's (points) and the
ratio to its time, beside the paper's same two numbers, and whether the paper's ordering of the
schemes holds on our runs.  Written as <figdir>/<FIG>.json (every run's numbers, the rows, the
machine, date and command) and <FIG>.md, which `markdown` renders from the json alone.  Plain
Python, no TensorFlow."""
import datetime
import statistics

from elastictrainer import runlog
from elastictrainer.data import NUM_CLASSES
from elastictrainer.experiments import perfdoc
from elastictrainer.experiments.protocols import offline_regime
from elastictrainer.machine import machine_info, machine_text
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.models import MODELS

# The paper's numbers, read off its plots: per (train_type, rho) the best test accuracy (%) and
# the training time (h).  Fig. 19's plots were not read off: its rows have none.
PAPER = {
    "fig17": {"setting": "ResNet50 from ImageNet weights on CUB-200, Jetson TX2",
              "schemes": {("elastic_training", 0.4): (66.5, 0.85),
                          ("full_training", None): (69.0, 2.95),
                          ("traditional_tl_training", None): (43.0, 0.7),
                          ("bn_plus_bias_training", None): (57.5, 1.8),
                          ("prunetrain", None): (69.5, 2.8)}},
}
# The ordering the paper shows, as rules on a row's numbers against full training's: the rho it
# reports ElasticTrainer at, how close "keeps full training's accuracy" is (its own gap at that
# rho), the share of full training's time it takes at most, and how near "near full training"
# is in time (PruneTrain: 0.95x in the paper)
PAPER_RHO = 0.4
CLOSE_POINTS = 2.5
AT_MOST_TIME = 0.5
NEAR_TIME = (0.75, 1.25)
BELOW_ELASTIC = ("traditional_tl_training", "bn_plus_bias_training")
SGD_WORDS = " (momentum 0.9, cosine decay, decoupled weight decay)"  # flavors/optimizers.py's


def results(driver, done, skipped):
    """The json of a figure's offline table: `done` is [(Run, run directory)] of the finished
    runs, `skipped` the driver's lines for the runs it did not start."""
    runs = []
    for run, path in done:
        summary = runlog.read_summary(path)
        runs.append({"model": run.model, "dataset": run.dataset, "train_type": run.train_type,
                     "rho": run.rho, "seed": summary.get("seed"),
                     "best_accuracy": summary["best_test_accuracy"],
                     "train_time_s": summary["train_time_s"],
                     "measured_ratio": summary.get("measured_ratio"),
                     "wall_ratio": summary.get("wall_ratio")})
    models = list(dict.fromkeys(run.model for run, _ in done))
    # each model's own regime (protocols.offline_regime): its flags and its target
    protocols = {}
    for model in models or driver.figure.offline_models[:1]:
        protocol, dataset = offline_regime(model)
        protocols[model] = {**protocol.flags(model), "dataset": dataset,
                            "num_classes": NUM_CLASSES[dataset]}
    return {"figure": driver.key, "title": driver.figure.title,
            "date": datetime.date.today().isoformat(),
            "machine": machine_info(_tensorflow_version()), "command": command(driver),
            "protocols": protocols, "cache_frozen_prefix": driver.cache_frozen_prefix,
            "models": models, "paper": PAPER.get(driver.key, {}).get("setting"),
            "not_offline": [m for m in driver.figure.models if m not in models and not (
                m in MODELS and MODELS[m].synthetic)],
            "skipped": list(skipped), "runs": runs, "rows": rows(runs, driver.key)}


def command(driver):
    """The figure's command line as a user types it: the flags that choose its runs, none of
    the paths (the table is the same wherever the runs were written)."""
    words = ["elastictrainer", "figure", driver.key, "--offline"]
    if driver.ego:
        words.append("--ego")
    if tuple(driver.seeds) != (0,):
        words += ["--seeds", ",".join(map(str, driver.seeds))]
    if driver.steps_per_epoch:
        words += ["--steps_per_epoch", str(driver.steps_per_epoch)]
    if driver.num_test:
        words += ["--num_test", str(driver.num_test)]
    if driver.cache_frozen_prefix is not False:
        words += ["--cache_frozen_prefix", str(driver.cache_frozen_prefix).lower()]
    return " ".join(words)


def _tensorflow_version():
    """The installed TensorFlow's version, read without starting it (the runs' Python)."""
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-aarch64"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def rows(runs, key):
    """Per model and scheme (seeds averaged), in the order the runs are listed: our numbers
    against full training's, the paper's, and the check of the paper's ordering."""
    groups = {}
    for r in runs:
        groups.setdefault((r["model"], r["train_type"], r["rho"]), []).append(r)
    paper = PAPER.get(key, {}).get("schemes", {})
    paper_full = paper.get(("full_training", None))
    out = []
    for (model, train_type, rho), members in groups.items():
        full = groups.get((model, "full_training", None))
        row = {"model": model, "train_type": train_type, "rho": rho, "seeds": len(members),
               "best_accuracy": statistics.mean(r["best_accuracy"] for r in members),
               "train_time_s": statistics.mean(r["train_time_s"] for r in members),
               "accuracy_diff": None, "time_ratio": None, "paper": None,
               # an elastic run's own estimate of its wall clock against full training's, from
               # full steps timed in the same minutes: free of a shared machine's load changing
               # between the runs
               "wall_ratio": _mean_known(r.get("wall_ratio") for r in members)}
        if full:
            row["accuracy_diff"] = row["best_accuracy"] - statistics.mean(
                r["best_accuracy"] for r in full)
            row["time_ratio"] = row["train_time_s"] / statistics.mean(
                r["train_time_s"] for r in full)
        if (train_type, rho) in paper and paper_full:
            accuracy, hours = paper[train_type, rho]
            row["paper"] = {"accuracy": accuracy, "hours": hours,
                            "accuracy_diff": accuracy - paper_full[0],
                            "time_ratio": hours / paper_full[1]}
        out.append(row)
    for row in out:
        elastic = next((r for r in out if r["model"] == row["model"] and r["rho"] == PAPER_RHO
                        and r["train_type"] == "elastic_training"), None)
        row["rule"], row["agrees"] = check(row, elastic)
    return out


def _mean_known(values):
    known = [v for v in values if v is not None]
    return statistics.mean(known) if known else None


def check(row, elastic):
    """(the paper's ordering for this row in words, whether our row keeps it: True, False, or
    None where there is no rule or nothing to hold it against)."""
    train_type, diff, ratio = row["train_type"], row["accuracy_diff"], row["time_ratio"]
    if train_type == "full_training":
        return "the reference", None
    if train_type == "elastic_training" and row["rho"] == PAPER_RHO:
        rule = (f"within {CLOSE_POINTS:g} points of full training in at most "
                f"{AT_MOST_TIME:g}x its time")
        if diff is None:
            return rule, None
        return rule, diff >= -CLOSE_POINTS and ratio <= AT_MOST_TIME
    if train_type in BELOW_ELASTIC:
        rule = f"below ElasticTrainer at rho {PAPER_RHO:g} in accuracy"
        if elastic is None:
            return rule + " (no such run here)", None
        return rule, row["best_accuracy"] < elastic["best_accuracy"]
    if train_type == "prunetrain":
        rule = (f"near full training in both: within {CLOSE_POINTS:g} points, "
                f"{NEAR_TIME[0]:g}-{NEAR_TIME[1]:g}x its time")
        if diff is None:
            return rule, None
        return rule, abs(diff) <= CLOSE_POINTS and NEAR_TIME[0] <= ratio <= NEAR_TIME[1]
    return "none (the paper's plots were not read at this rho)", None


def label(row):
    name = SCHEMES[row["train_type"]].label if row["train_type"] in SCHEMES else row["train_type"]
    return name if row["rho"] is None else f"{name} (rho {runlog.rho_text(row['rho'])})"


def _seconds(s):
    return f"{s:.0f} s" if s < 600 else f"{s / 60:.1f} min"


def _points(diff):
    # rounded first, so that a hair under zero reads +0.0, not -0.0
    return "n/a" if diff is None else f"{round(diff, 1) + 0.0:+.1f} points"


def _ratio(ratio):
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _verdict(agrees):
    return {True: "agrees", False: "disagrees", None: "n/a"}[agrees]


def _protocol_words(data):
    """Each model's regime in words, then the prefix cache the runs shared."""
    cache = data["cache_frozen_prefix"]
    cache = ("off (the paper's protocol: every step runs the whole forward pass)"
             if cache is False else str(cache).lower())
    parts = []
    for model, p in data["protocols"].items():
        parts.append(
            f"{model} from `--weights {p['weights']}` on {p['dataset']} ({p['num_train']} "
            f"training and {p['num_test']} test images, {p['num_classes']} classes), "
            f"{p['input_size']} px, batch {p['batch_size']}, {p['optimizer'].upper()}"
            f"{SGD_WORDS if p['optimizer'] == 'sgd' else ''} at {p['learning_rate']:g}, "
            f"{p['num_epochs']} epochs, re-selection every {p['interval']:g} epochs"
            f"{', --bn_mode ' + p['bn_mode'] if 'bn_mode' in p else ''}")
    return "; ".join(parts) + f"; prefix cache {cache}"


def markdown(data):
    """The table of a figure's offline json (results())."""
    lines = [f"# {data['title'].split(':')[0]} offline: our numbers beside the paper's", "",
             f"Machine: {machine_text(data['machine'])}; {data['date']}; `{data['command']}`.",
             "", f"Ours: {_protocol_words(data)}."]
    if data["paper"]:
        lines.append(f"The paper's: {data['paper']}.")
    else:
        lines.append("The paper's numbers for this figure were not read off its plots: each "
                     "row has the rule alone.")
    for model in data["not_offline"]:
        lines.append(f"{model}: no weights offline, not run.")
    head = ["model", "scheme", "seeds", "best accuracy", "training time", "accuracy vs full",
            "time vs full", "(in the run)", "paper: accuracy vs full", "paper: time vs full",
            "the paper's ordering"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["rows"]:
        paper = row["paper"] or {}
        cells = [row["model"], label(row), str(row["seeds"]), f"{row['best_accuracy']:.1f}%",
                 _seconds(row["train_time_s"]), _points(row["accuracy_diff"]),
                 _ratio(row["time_ratio"]), _ratio(row.get("wall_ratio")),
                 _points(paper.get("accuracy_diff")),
                 _ratio(paper.get("time_ratio")),
                 "reference" if row["train_type"] == "full_training" else _verdict(row["agrees"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per row, the paper's ordering and ours:", ""]
    for row in data["rows"]:
        if row["train_type"] == "full_training":
            continue
        paper = row["paper"]
        theirs = (f"; the paper: {paper['accuracy']:g}% in {paper['hours']:g} h "
                  f"({_points(paper['accuracy_diff'])}, {_ratio(paper['time_ratio'])})"
                  if paper else "")
        lines.append(f"- {row['model']}, {label(row)}: {_verdict(row['agrees'])}. Rule: "
                     f"{row['rule']}. Ours: {row['best_accuracy']:.1f}% in "
                     f"{_seconds(row['train_time_s'])} ({_points(row['accuracy_diff'])}, "
                     f"{_ratio(row['time_ratio'])}){theirs}.")
    for line in data["skipped"]:
        lines.append(f"- skipped {line}")
    lines += ["", "Accuracy: each run's best test accuracy; time: its training time "
              "(summary.json's train_time_s), without the one profiling per model that the "
              "runs share; seeds averaged.  (in the run): an ElasticTrainer run's own estimate "
              "of its wall clock against full training's, from full steps it timed in the same "
              "minutes (summary.json's wall_ratio): a load that changed between the runs does "
              "not skew it, but it leaves out what each step costs outside its compiled step "
              "(the input pipeline, the loop), which the ratio across runs holds."]
    return "\n".join(lines) + "\n"


def write_table(driver, done, skipped):
    """Write <figdir>/<FIG>.json and .md of the driver's finished runs; [the .md's path]."""
    import os

    out = os.path.join(driver.figdir, f"{driver.key}{driver.suffix}")
    if driver.dry_run:
        driver.log(f"would write {out}.md and .json: each scheme against full training, "
                   f"beside the paper's numbers")
        return []
    if not done:
        return []
    data = results(driver, done, skipped)
    os.makedirs(driver.figdir, exist_ok=True)
    runlog.write_json(out + ".json", data)
    runlog.write_text(out + ".md", markdown(data))
    if os.path.abspath(driver.figdir) == os.path.join(perfdoc.FIGURES, "offline"):
        perfdoc.update_offline(f"{driver.key}{driver.suffix}")  # the clone's docs show it
    return [out + ".md"]
