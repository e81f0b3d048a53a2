"""--bn_mode model against --bn_mode inference: test accuracy, and what the prefix cache makes of it.

    python scripts/bench_bn_mode.py                                  # both configurations
    python scripts/bench_bn_mode.py --configs user_resnet --seeds 0 --epochs 2 --out /tmp/bn

Configurations (--configs):
  user_resnet  a user's tf-keras residual CNN whose BatchNorm layers run in the step's mode
               (called without training=False), pretrained here with model.fit on the synthetic
               source task, fine-tuned on the synthetic dataset at 32 px through
               elastictrainer.run(model=...) behind the built-in models' random flip and
               rotation (without them the task is solved in one epoch, 99%)
  smallcnn     the built-in smallcnn from --weights synthetic at 64 px, batch 32, Adam, whose
               backbone is called with training=False already: the mode should change nothing
Each configuration trains, per seed and per --bn_mode, full training and ElasticTrainer at each
--rhos (smallcnn: the first) with --cache_frozen_prefix and --cache_fixed_views on.  The table
gives the final and best test accuracy (mean over seeds, each seed's in brackets), the
training time, the measured step ratio and where the prefix cache cut.  A refused run (a rho below the forward floor) says
why in its row.

Writes <out>.json and <out>.md and, into this clone's figures/, its block of
docs/performance.md.  Finished runs under --logdir of the same settings are read, not run
again.
"""
import dataclasses
import datetime
import os

from elastictrainer.config import ArgumentParser, comma_list  # no TensorFlow: --help stays quick
from elastictrainer.errors import UserError
from elastictrainer.experiments import perfdoc, recorded
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("model", "inference")
# The fine-tuning settings of each configuration (Config fields)
CONFIGS = {
    "user_resnet": dict(dataset_name="synthetic", num_train=4800, num_test=1024, input_size=32,
                        batch_size=32, optimizer="adam", learning_rate=0.001),
    "smallcnn": dict(model_name="smallcnn", weights="synthetic", dataset_name="synthetic",
                     num_train=4800, num_test=1024, input_size=64, batch_size=32,
                     optimizer="adam", learning_rate=0.001),
}
# the user's model: pretrained once (seed 0) on the source task, like weights one downloads
PRETRAIN_EXAMPLES, PRETRAIN_EPOCHS = 7200, 4


def build_parser():
    p = ArgumentParser(prog="bench_bn_mode.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), type=comma_list(str, "names"),
                   help=f"configurations: {', '.join(CONFIGS)}")
    p.add_argument("--seeds", default="0,1", type=comma_list(int, "integers"),
                   help="seeds of user_resnet (smallcnn runs the first only)")
    p.add_argument("--rhos", default="0.3,0.5", type=comma_list(float),
                   help="ElasticTrainer's rho values (smallcnn runs the first only)")
    p.add_argument("--epochs", type=int, default=5, help="epochs of every fine-tuning run")
    p.add_argument("--logdir", default="logs/bench_bn_mode", help="where runs go")
    p.add_argument("--out", default=os.path.join(HERE, "figures", "bench_bn_mode"),
                   help="output path without extension (.json, .md)")
    return p


def residual_cnn(keras, classes, size, augment=True):
    """A user's model: [random flip and rotation,] conv stem, three residual stages (16, 32, 48
    channels), each conv followed by BatchNorm in the step's mode, global pooling, a dense
    head."""
    inputs = x = keras.Input((size, size, 3))
    if augment:
        x = keras.layers.RandomFlip("horizontal", name="augment_flip")(x)
        x = keras.layers.RandomRotation(0.2, name="augment_rotation")(x)
    x = keras.layers.Rescaling(1 / 255.0, name="scale")(x)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem_conv")(x)
    x = keras.layers.ReLU(name="stem_relu")(keras.layers.BatchNormalization(name="stem_bn")(x))
    for stage, width in enumerate((16, 32, 48)):
        stride = 1 if stage == 0 else 2
        shortcut = x
        if stride != 1 or x.shape[-1] != width:
            shortcut = keras.layers.Conv2D(width, 1, strides=stride, use_bias=False,
                                           name=f"s{stage}_proj")(x)
            shortcut = keras.layers.BatchNormalization(name=f"s{stage}_proj_bn")(shortcut)
        y = keras.layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False,
                                name=f"s{stage}_conv0")(x)
        y = keras.layers.ReLU(name=f"s{stage}_relu0")(
            keras.layers.BatchNormalization(name=f"s{stage}_bn0")(y))
        y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False,
                                name=f"s{stage}_conv1")(y)
        y = keras.layers.BatchNormalization(name=f"s{stage}_bn1")(y)
        x = keras.layers.ReLU(name=f"s{stage}_out")(keras.layers.Add(name=f"s{stage}_add")(
            [shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x), name="user_resnet")


def pretrained_resnet(args, log):
    """A function giving the user's model for the target task, fresh each call, from weights
    pretrained once with model.fit on the synthetic source task (kept under --logdir)."""
    import tensorflow as tf
    import tf_keras as keras

    from elastictrainer.data import NUM_CLASSES, synthetic

    size = CONFIGS["user_resnet"]["input_size"]
    path = os.path.join(args.logdir, "user_resnet", "pretrained.weights.h5")
    keras.utils.set_random_seed(0)
    source = residual_cnn(keras, synthetic.SOURCE_NUM_CLASSES, size, augment=False)
    if not os.path.exists(path):
        log("--- user_resnet: pretraining on the synthetic source task")
        data = synthetic.synthetic_source_examples(size, PRETRAIN_EXAMPLES, seed=0).cache()
        data = data.shuffle(PRETRAIN_EXAMPLES, seed=0).batch(32).prefetch(tf.data.AUTOTUNE)
        source.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), metrics=["accuracy"])
        history = source.fit(data, epochs=PRETRAIN_EPOCHS, verbose=0)
        log(f"    source accuracy {100 * history.history['accuracy'][-1]:.1f}% (training)")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        source.save_weights(path)
    source.load_weights(path)

    def fresh(seed):
        keras.utils.set_random_seed(seed)
        model = residual_cnn(keras, NUM_CLASSES["synthetic"], size)
        for layer in model.layers[:-1]:
            if layer.weights:
                layer.set_weights(source.get_layer(layer.name).get_weights())
        return model

    return fresh


def config_runs(name, seed, rhos, args, log, model_for=None):
    """{(scheme, bn_mode): result} of one seed of a configuration."""
    import elastictrainer

    fields = CONFIGS[name]
    base = elastictrainer.Config(**fields, num_epochs=args.epochs, seed=seed,
                                 logdir=os.path.join(args.logdir, name), progress=False,
                                 energy="none", resume=True)
    schemes = [("full training", "full_training", {})] + [
        (f"ElasticTrainer rho {rho:g}, cached", "elastic_training",
         {"rho": rho, "cache_frozen_prefix": True, "cache_fixed_views": True})
        for rho in rhos]
    results = {}
    for label, train_type, extra in schemes:
        for mode in MODES:
            slug = f"{label}_{mode}".replace(" ", "_").replace(",", "")
            if model_for is not None:  # a model object: its table beside the runs, per mode
                extra = dict(extra, timing_table=os.path.join(
                    base.logdir, f"table_{mode}_b{base.batch_size}.json"))
            cfg = dataclasses.replace(base, train_type=train_type, bn_mode=mode,
                                      run_name=f"{slug}_seed{seed}", **extra)
            summary = recorded.finished_run(cfg)
            said = []
            if summary is None:
                log(f"--- {name} seed {seed}: {label}, --bn_mode {mode}")
                try:
                    summary = elastictrainer.run(
                        cfg, log=said.append,
                        model=model_for(seed) if model_for is not None else None)
                except UserError as e:  # a rho below the forward floor, say: the row says so
                    log(f"    refused: {e}")
                    results[(label, mode)] = {"refused": str(e)}
                    continue
            results[(label, mode)] = result_of(summary, said)
    return results


def result_of(summary, said):
    """What the table shows of one run's summary.json (and its log lines about the mode and
    the cache, when it ran now)."""
    epochs = summary["epochs"]
    cache = summary.get("prefix_cache") or {}
    builds = cache.get("builds") or []
    return {"final": epochs[-1]["test_accuracy"], "best": summary["best_test_accuracy"],
            "curve": [e["test_accuracy"] for e in epochs], "train_s": summary["train_time_s"],
            "ratio": summary.get("measured_ratio"),
            "cuts": sorted({b["cut"] for b in builds}),
            "served": cache.get("served_share"),
            "said": [m for m in said if "--bn_mode" in m or "prefix cache" in m]}


def _mean(values):
    return sum(values) / len(values)


def _accuracy(runs, key):
    values = [r[key] for r in runs]
    each = ", ".join(f"{v:.1f}" for v in values)
    return f"{_mean(values):.1f}%" + (f" ({each})" if len(values) > 1 else "")


def table(rows):
    """Markdown rows of one configuration: {(scheme, bn_mode): [result per seed]}."""
    lines = ["| scheme | `--bn_mode` | seeds | final accuracy | best accuracy | training time "
             "| measured step ratio | prefix cache |", "|---|---|---|---|---|---|---|---|"]
    for (label, mode), runs in rows.items():
        refused = [r["refused"] for r in runs if "refused" in r]
        runs = [r for r in runs if "refused" not in r]
        if not runs:
            lines.append(f"| {label} | {mode} | {len(refused)} | refused: "
                         f"{refused[0].split(' (')[0]} | | | | |")
            continue
        ratios = [r["ratio"] for r in runs if r["ratio"] is not None]
        cuts = sorted({c for r in runs for c in r["cuts"]})
        served = [r["served"] for r in runs if r["served"] is not None]
        cache = (f"at {', '.join(cuts)}, {100 * _mean(served):.0f}% of steps served"
                 if cuts else "no usable cut" if "cached" in label else "off")
        lines.append(f"| {label} | {mode} | {len(runs)} | {_accuracy(runs, 'final')} | "
                     f"{_accuracy(runs, 'best')} | {_mean([r['train_s'] for r in runs]):.0f} s "
                     f"| {f'{_mean(ratios):.2f}' if ratios else '-'} | {cache} |")
    return "\n".join(lines)


def same_curves(rows):
    """Per scheme, whether both modes gave the same per-epoch test accuracies on every seed."""
    out = {}
    for (label, mode), runs in rows.items():
        if mode != MODES[0] or (label, MODES[1]) not in rows:
            continue
        other = rows[(label, MODES[1])]
        out[label] = all("curve" in a and "curve" in b and a["curve"] == b["curve"]
                         for a, b in zip(runs, other))
    return out


def markdown(results, args, machine):
    lines = [f"Machine: {machine_text(machine)}; {results['date']}; "
             f"`python scripts/bench_bn_mode.py --configs {','.join(args.configs)} --seeds "
             f"{','.join(map(str, args.seeds))} --rhos {','.join(f'{r:g}' for r in args.rhos)} "
             f"--epochs {args.epochs}` (every other setting at its default; timings on a "
             f"shared machine).", ""]
    for name, config in results["configs"].items():
        same = ", ".join(f"{label}: {'yes' if ok else 'no'}"
                         for label, ok in config["same_curves"].items())
        lines += [f"**{name}** (per-epoch accuracies identical in both modes: {same}):", "",
                  config["table"], ""]
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    log = print
    machine = machine_info()
    results = {"date": datetime.date.today().isoformat(), "machine": machine,
               "args": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in vars(args).items()}, "configs": {}}
    for name in args.configs:
        if name not in CONFIGS:
            raise UserError(f"unknown configuration {name!r}; valid: {', '.join(CONFIGS)}")
        model_for = pretrained_resnet(args, log) if name == "user_resnet" else None
        seeds, rhos = ((args.seeds, args.rhos) if name == "user_resnet"
                       else (args.seeds[:1], args.rhos[:1]))
        rows = {}
        for seed in seeds:
            for key, result in config_runs(name, seed, rhos, args, log, model_for).items():
                rows.setdefault(key, []).append(dict(result, seed=seed))
        results["configs"][name] = {
            "runs": [{"scheme": k[0], "bn_mode": k[1], "seeds": v} for k, v in rows.items()],
            "same_curves": same_curves(rows), "table": table(rows)}
    text = markdown(results, args, machine)
    perfdoc.write_benchmark(args.out, results, text)
    print(text)
    return 0


if __name__ == "__main__":
    from elastictrainer.errors import run_cli

    run_cli(main)
