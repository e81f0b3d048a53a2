"""Past the forward floor: the frozen prefix cached (--cache_frozen_prefix) against the same runs
without it.

Usage (from the repo root; figures/bench_prefix_cache.{json,md} came from
`--seeds 0,1,2,3,4 --rhos 0.5 --caches off,auto,views1,views2,views2_fp16 --parts
smallcnn,flip`, `--seeds 0,1,2 --rhos 0.5,0.3 --parts fit` and, a day earlier, `--parts
resnet50`; a part not run again keeps its last results):
    python scripts/bench_prefix_cache.py [--seeds 0] [--rhos 0.3,0.4,0.5] [--caches off,auto]
        [--fixed 12] [--parts smallcnn,fit,resnet50,flip] [--logdir logs/bench_prefix_cache]
        [--out figures/bench_prefix_cache.json]

smallcnn: the smallcnn setting (the built-in smallcnn fine-tuned from --weights synthetic on the
synthetic data at 64 px, Adam 1e-3, 12 epochs, 4800 images): full training, then ElasticTrainer
at each rho with each --caches setting (experiments/prefix_cache_report.CACHES: off, the
paper's protocol; auto, the default; viewsK, K augmented views of each image, since the
built-in models augment their input at random; views2_fp16, stored in float16), and the
selection "tensor k to the output" held fixed
for the whole run (--fixed; 12: the last stage and the head) uncached and with the default
cache.  Without the cache a rho below the forward floor is refused; those cells stay empty.  Each
row gives the best test accuracy and the mean of the last 3 epochs, the training time against full
training's (two runs minutes apart) and against the run's own estimate (wall_ratio, full steps
timed in the same minutes), the measured step ratio of the cached steps, the cut points, the
share of steps served from the cache and the time spent filling it, and the load average
around the run.  Finished runs in --logdir are read, not run again.

fit: a pretrained Keras 3 CNN (experiments/fit_task.py: the built-in models' random flip and
rotation in front, BatchNorm in every stage) fine-tuned through model.fit for FIT_EPOCHS epochs,
warm in one process after a warm-up fit: plain fit on all weights, then ElasticCallback at each
rho with the default cache and without it (cache_frozen_prefix=False), bn_mode inference in
both (Keras 3 runs a nested BatchNorm in the step's mode, so only inference mode leaves a cut
above it); each elastic run profiles from an empty folder.  Training time is the epochs' plus
what comes before the first (an elastic run's first profiling), validation excluded
(experiments/fit_task.epoch_clock), against plain fit's.

flip: for each cut of the smallcnn setting's pretrained model, how far a horizontal flip of the
feature map is from the prefix's output for the flipped image (what feature-space augmentation
would have to match).

resnet50: the ResNet50 224 px, batch 4 step bench (random weights, SGD, 200 classes; profiled
first when its table is missing): for each rho, the selection eq. 3 makes with every tensor
equally important, without the cache and with it, and the last stage (conv5 and the head)
selected by hand; each selection's step timed without and with the cache (its batches cached
first), interleaved with full steps, medians of --repeats rounds of --steps steps.
"""
import dataclasses
import datetime
import json
import os
import statistics
import time

from elastictrainer.experiments import perfdoc, prefix_cache_report as report, recorded
from elastictrainer.experiments.prefix_cache_report import CACHES, FIT_REFERENCE, cache_label
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.errors import UserError, run_cli
from elastictrainer.machine import machine_info, machine_text

SMALLCNN = ("--model_name smallcnn --weights synthetic --dataset_name synthetic --num_train 4800 "
             "--num_test 1024 --input_size 64 --batch_size 32 --optimizer adam "
             "--learning_rate 0.001")
PARTS = ("smallcnn", "fit", "resnet50", "flip")


def build_parser():
    ap = ArgumentParser(prog="bench_prefix_cache.py", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", type=comma_list(int, "integers"), help="seeds")
    ap.add_argument("--rhos", default="0.3,0.4,0.5", type=comma_list(float, "numbers"),
                    help="rho of the elastic runs and of the step bench")
    ap.add_argument("--caches", default="off,auto", type=comma_list(str, "names"),
                    help="smallcnn: the cache settings of the elastic rows: " + ", ".join(CACHES))
    ap.add_argument("--fixed", default="12", type=comma_list(int, "integers"),
                    help="smallcnn: fixed selections, tensor k to the output, for each k")
    ap.add_argument("--parts", default=",".join(PARTS), type=comma_list(str, "names"),
                    help=f"which parts to run: {', '.join(PARTS)}")
    ap.add_argument("--repeats", type=int, default=3, help="resnet50: interleaved rounds")
    ap.add_argument("--steps", type=int, default=3, help="resnet50: timed steps per round")
    ap.add_argument("--logdir", default="logs/bench_prefix_cache", help="where runs go")
    ap.add_argument("--out", default="figures/bench_prefix_cache.json",
                    help="JSON results; a Markdown table is written beside it (.md)")
    return ap


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


# ------------------------------------------------------------------ a Keras 3 model in model.fit
FIT_EPOCHS = 12  # the smallcnn setting's


def fit_task_text():
    from elastictrainer.experiments import fit_task

    return (f"experiments/fit_task.py: {fit_task.SIZE} px, batch {fit_task.BATCH}, "
            f"{fit_task.TRAIN} images, Adam 1e-3, random flip and rotation in front")


def fit(args):
    """Rows of the model.fit part: per seed, plain fit and ElasticCallback cached and not."""
    import keras

    from elastictrainer.experiments import fit_task
    from elastictrainer.runlog import read_summary

    rows = []
    for seed in args.seeds:
        workdir = os.path.join(args.logdir, "fit", f"s{seed}")
        task = fit_task.PretrainedTask(keras, os.path.join(args.logdir, "fit"), seed)
        task.warm_up()
        variants = [(FIT_REFERENCE, None, None)]
        variants += [(f"ElasticCallback{cache_label(cache)}", rho, cache)
                     for rho in args.rhos for cache in ("off", "auto")]
        plain_s = None
        for label, rho, cache in variants:
            model, clock = task.fresh(), fit_task.epoch_clock(keras)
            callbacks, out = [clock], None
            if rho is not None:
                out = os.path.join(workdir, f"rho{rho:g}_{cache}")
                # every elastic run pays its first profiling, inside its time
                callbacks.append(fit_task.first_run_callback(
                    out, rho=rho, bn_mode="inference", seed=seed,
                    cache_frozen_prefix=CACHES[cache]["cache_frozen_prefix"]))
            before = load()
            try:
                model.fit(task.train, epochs=FIT_EPOCHS, validation_data=task.test,
                          verbose=0, callbacks=callbacks)
            except UserError as e:  # below the uncached forward floor
                print(f"{label} rho {rho}: {e}", flush=True)
                rows.append({"seed": seed, "run": label, "rho": rho, "cache": cache,
                             "error": str(e)})
                continue
            accuracy = [a for _, a in clock.points]
            spent = clock.points[-1][0]
            plain_s = spent if rho is None else plain_s
            summary = read_summary(out) if out else {}
            rows.append({
                "seed": seed, "run": label, "rho": rho, "cache": cache,
                "best": max(accuracy), "last3": sum(accuracy[-3:]) / len(accuracy[-3:]),
                "train_time_s": spent, "time_ratio": spent / plain_s if plain_s else None,
                "wall_ratio": summary.get("wall_ratio"),
                "step_ratio": summary.get("measured_ratio"), **report.cache_fields(summary),
                "tensors": (sum(summary["selections"][-1]["mask"])
                            if summary.get("selections") else len(model.trainable_weights)),
                "load": [before, load()]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ------------------------------------------------------------------ the smallcnn setting
def smallcnn(args):
    from elastictrainer import cli
    from elastictrainer.experiments.compare import compare, last_epochs_accuracy
    from elastictrainer.method.schemes import register_fixed_from as register_fixed

    rows = []
    for seed in args.seeds:
        base = cli.config_from_args(cli.train_parser().parse_args(
            SMALLCNN.split() + ["--seed", str(seed), "--quiet", "--logdir", args.logdir]))
        variants = [("full training", None, "off")]
        variants += [(f"ElasticTrainer{cache_label(cache)}", rho, cache)
                     for rho in args.rhos for cache in args.caches]
        variants += [(f"tensors {k}-19 fixed{cache_label(cache)}", -k, cache)
                     for k in args.fixed for cache in ("off", "auto")]
        full_time = None
        for label, rho, cache in variants:
            name = ("full" if rho is None else f"fixed{-rho}_{cache}" if rho < 0 else
                    f"rho{rho:g}_{cache}")
            cfg = dataclasses.replace(
                base, rho=rho if rho and rho > 0 else base.rho, **CACHES[cache],
                run_name=f"s{seed}_{name}")
            kind = ("full_training" if rho is None else register_fixed(-rho) if rho < 0 else
                    "elastic_training")
            rho = rho if rho and rho > 0 else None
            before = load()
            try:
                summary, = compare(cfg, [kind])
            except recorded.OtherSettings:  # a run of other settings under this name: stop
                raise
            except Exception as e:  # noqa: BLE001  (rho below the floor: a UserError)
                print(f"{label} rho {rho}: {e}", flush=True)
                rows.append({"seed": seed, "run": label, "rho": rho, "cache": cache,
                             "error": str(e)})
                continue
            # the load around the run, kept beside it: a finished run is read, not run again
            load_file = os.path.join(args.logdir, f"{cfg.run_name}_{kind}", "bench_load.json")
            if os.path.exists(load_file):
                with open(load_file) as f:
                    around = json.load(f)
            else:
                around = [before, load()]
                with open(load_file, "w") as f:
                    json.dump(around, f)
            if kind == "full_training":
                full_time = summary["train_time_s"]
            rows.append({
                "seed": seed, "run": label, "rho": rho, "cache": cache,
                "best": summary["best_test_accuracy"], "last3": last_epochs_accuracy(summary),
                "train_time_s": summary["train_time_s"],
                "time_ratio": summary["train_time_s"] / full_time if full_time else None,
                "wall_ratio": summary.get("wall_ratio"),
                "step_ratio": summary.get("measured_ratio"),
                **report.cache_fields(summary, selection_cuts=True),
                "tensors": summary["epochs"][-1]["selected"] if summary["epochs"] else None,
                "load": around})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ------------------------------------------------------------------ flip at the cut
FLIP_IMAGES = 64


def flip():
    """For each cut of the smallcnn setting's model: the relative distance between the prefix's
    output of flipped images and the flipped output of the images (0 where a flip maps exactly:
    a convolution's padding and strides make it inexact at the borders)."""
    import numpy as np
    import tensorflow as tf

    from elastictrainer.data.loaders import load_dataset
    from elastictrainer.models.build import build_sized
    from elastictrainer.prefix.graph import FlatGraph

    model, _, _ = build_sized("smallcnn", 64, 4, "synthetic", log=lambda m: None)
    bundle = load_dataset("synthetic", input_size=64, batch_size=FLIP_IMAGES, seed=0,
                          num_train=FLIP_IMAGES, num_test=FLIP_IMAGES)
    x = next(iter(bundle.train))[0]
    graph = FlatGraph(model)
    rows = []
    for cut in graph.cuts:
        if len(cut.shape) != 3:
            continue
        prefix = graph.prefix_model(cut)
        # inference mode: the input augmentation off, so only the flip differs
        a = prefix(tf.image.flip_left_right(x), training=False).numpy()
        b = tf.image.flip_left_right(prefix(x, training=False)).numpy()
        err = np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12)
        inner = np.linalg.norm((a - b)[:, :, 1:-1]) / max(np.linalg.norm(a[:, :, 1:-1]), 1e-12)
        rows.append({"cut": cut.name, "shape": list(cut.shape), "relative_error": float(err),
                     "without_border_columns": float(inner)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# ------------------------------------------------------------------ the ResNet50 step bench
def resnet50(args, workdir):
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from elastictrainer import config
    from elastictrainer.train import steps as train_steps
    from elastictrainer.flavors import optimizers
    from elastictrainer.prefix import cache as prefix_cache, plan as prefix_plan
    from elastictrainer.models.build import build_sized
    from elastictrainer.profiler.run import load_or_profile
    from elastictrainer.profiler.table import default_table_path
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.method.schemes import SCHEMES
    from elastictrainer.method.time_model import TimeModel
    from elastictrainer.train.compiled import CompiledSteps

    size, batch, classes, batches = 224, 4, 200, 4
    keras.utils.set_random_seed(0)
    model, _, _ = build_sized("resnet50", size, classes, "none")
    path = default_table_path("resnet50", size, batch, classes)
    table = load_or_profile(path, model, "resnet50", size, batch, classes)
    cfg = config.Config(cache_frozen_prefix=True, cache_fixed_views=True)
    cache = prefix_plan.plan(model, list(model.trainable_weights), cfg, batches * batch, workdir)
    trainer = CompiledSteps(model, optimizers.make_optimizer("sgd", 1e-4, 5e-4, 10**6),
                            SCHEMES["elastic_training"], tensor_roles(model), prefix_cache=cache)
    trainer.steps.maxsize = 16
    plain_tm, cached_tm = TimeModel(table), TimeModel(table, cache=cache.for_time_model())
    n = len(trainer.variables)
    names = [v.name for v in trainer.variables]
    importance = np.ones(n)
    selections = {}
    for rho in args.rhos:
        for label, tm in (("uncached", plain_tm), ("cached", cached_tm)):
            if rho > tm.rho_floor:
                mask = tm.select(importance, rho)
                selections[f"rho {rho:g}, eq. 3 {label}"] = tuple(
                    int(k) for k in np.flatnonzero(mask))
    selections["last stage (conv5 + head)"] = tuple(
        k for k, name in enumerate(names) if name.startswith(("conv5_", "classifier")))
    rng = np.random.default_rng(0)
    data = [(tf.constant(rng.uniform(0, 255, (batch, size, size, 3)), tf.float32),
             tf.constant(rng.integers(0, classes, batch), tf.int32)) for _ in range(batches)]
    full = train_steps.make_train_step(model, trainer.optimizer, trainer.loss_fn, trainer.variables)
    steps = {"full": full}
    for label, sel in selections.items():
        steps[(label, "uncached")] = train_steps.make_train_step(
            model, trainer.optimizer, trainer.loss_fn, [trainer.variables[k] for k in sel])
        steps[(label, "cached")] = cache.step(  # the uncached step where it has no cut
            sel, lambda label=label: steps[(label, "uncached")],
            lambda suffix, cut, sel=sel: train_steps.make_train_step(
                suffix, trainer.optimizer, trainer.loss_fn, [trainer.variables[k] for k in sel]))

    warm = set()

    def ready(key, step):
        """Compile it and, for a cached step, fill its store (one store at a time: a step
        of another cut replaced it), untimed."""
        store = cache.store
        if key not in warm or (isinstance(step, prefix_cache.CachedStep) and (
                store is None or store.cut is not cache.cuts[step.cut] or not store.complete)):
            for x, y in data:
                train_steps.first_output(step(x, y)).numpy()
            warm.add(key)

    times = {k: [] for k in steps}
    for _ in range(args.repeats):
        for key, step in steps.items():
            ready(key, step)
            for i in range(args.steps):
                x, y = data[i % batches]
                t0 = time.perf_counter()
                train_steps.first_output(step(x, y)).numpy()
                times[key].append(time.perf_counter() - t0)
        print(f"round done, load {load():.1f}", flush=True)
    full_s = statistics.median(times["full"])
    rows = []
    for label, sel in selections.items():
        mask = np.zeros(n, bool)
        mask[list(sel)] = True
        cut = cached_tm.cut_of(mask)
        row = {"selection": label, "tensors": len(sel),
               "cut": None if cut is None else cache.cuts[cut].name,
               "predicted_uncached": plain_tm.predicted_ratio(mask),
               "predicted_cached": cached_tm.predicted_ratio(mask),
               "full_step_ms": 1e3 * full_s}
        for kind in ("uncached", "cached"):
            row[f"{kind}_ms"] = 1e3 * statistics.median(times[(label, kind)])
            row[f"{kind}_ratio"] = row[f"{kind}_ms"] / row["full_step_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    cache.close()
    return {"rows": rows, "forward_floor": plain_tm.rho_floor,
            "cached_floor": cached_tm.rho_floor, "table": path, "load": load()}


def main(argv=None):
    args = build_parser().parse_args(argv)
    for part in args.parts:
        if part not in PARTS:
            raise UserError(f"unknown part {part!r}; valid: {', '.join(PARTS)}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    previous = {}
    if os.path.exists(args.out):  # a part not run again keeps its last results
        with open(args.out) as f:
            previous = json.load(f)
    results = dict(previous.get("results", {}))
    when = datetime.date.today().isoformat()
    dates = previous.get("dates") or {part: previous.get("date") for part in results}
    dates.update({part: when for part in args.parts})
    if "smallcnn" in args.parts:
        results["smallcnn"] = smallcnn(args)
    if "fit" in args.parts:
        results["fit"] = fit(args)
    if "flip" in args.parts:
        results["flip"] = flip()
    if "resnet50" in args.parts:
        results["resnet50"] = resnet50(args, os.path.join(args.logdir, "resnet50_steps"))
    text = report.document(results, dates, machine_text(machine_info()), PARTS, SMALLCNN,
                           fit_task_text(), FIT_EPOCHS, FLIP_IMAGES)
    print(text)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "command": SMALLCNN, "machine": machine_info(),
                   "date": when, "dates": dates, "results": results}, f, indent=1)
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(text)
    perfdoc.update_for(md)


if __name__ == "__main__":
    run_cli(main)
