"""The same architecture in tf-keras and in Keras 3: what the profiler attributes, how long a
full step takes, and the step ratio an elastic run at rho measures, from the command line's loop
and from model.fit.

Why: the built-in models use tf-keras (fused BatchNormalization, stable op names); users bring
Keras 3 models, whose BatchNormalization is computed from its parts.  Each cell builds one
architecture with each Keras (the layer API is the same in both), profiles it
(profiler.profile_model: coverage, full step, forward share, a selection's compile), then trains
it with ElasticTrainer at rho for --steps steps on random data through elastictrainer.run (the
command line's loop) and reads the run's measured step ratio.  Both Kerases of a cell run in
one process, interleaved per repeat, so that load that comes and goes falls on both.

    python scripts/bench_keras.py                # every cell, about 6 minutes on 2 cores
    python scripts/bench_keras.py --cells cnn64 --steps 120 --out /tmp/k   # a quick look

Writes figures/bench_keras.{md,json} (and its block of docs/performance.md).
"""
import datetime
import os
import statistics
import tempfile

from elastictrainer import runlog
from elastictrainer.experiments import perfdoc
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# cell -> (architecture, input size, batch size, classes)
CELLS = {
    "cnn64": ("cnn", 64, 32, 10),
    "mobilenetv2_96": ("mobilenetv2", 96, 8, 10),
}
KERASES = ("tf_keras", "keras3")


def build_parser():
    p = ArgumentParser(prog="bench_keras.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default=",".join(CELLS), type=comma_list(str, "names"),
                   help=f"cells to run: {', '.join(CELLS)}")
    p.add_argument("--rho", type=float, default=0.5, help="the elastic runs' rho")
    p.add_argument("--steps", type=int, default=300, help="steps of each elastic run")
    p.add_argument("--repeats", type=int, default=2,
                   help="elastic runs per Keras and cell (interleaved); the median is shown")
    p.add_argument("--out", default=os.path.join(HERE, "figures", "bench_keras"),
                   help="output path without extension (.json and .md are written)")
    return p


def keras_module(name):
    if name == "keras3":
        import keras
    else:
        import tf_keras as keras
    return keras


def build(keras, arch, size, classes):
    """The cell's architecture, written once against the layer API both Kerases share."""
    inputs = keras.Input((size, size, 3))
    if arch == "mobilenetv2":
        x = keras.layers.Rescaling(1 / 127.5, offset=-1)(inputs)
        x = keras.applications.MobileNetV2(input_shape=(size, size, 3), include_top=False,
                                           weights=None)(x)
    else:
        x = keras.layers.Rescaling(1 / 255.0)(inputs)
        for filters in (32, 64, 128, 128):
            x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name=f"bench_{arch}")


def data(size, batch, classes, n_batches, seed):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    n = batch * n_batches
    x = rng.uniform(0, 255, (n, size, size, 3)).astype("float32")
    y = rng.integers(0, classes, n).astype("int32")
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().repeat()
    test = tf.data.Dataset.from_tensor_slices((x[:batch * 2], y[:batch * 2])).batch(batch)
    return train, test


def profile(flavor, arch, size, batch, classes, workdir):
    from elastictrainer.profiler import run as prun, table as tables

    keras = keras_module(flavor)
    keras.utils.set_random_seed(0)
    model = build(keras, arch, size, classes)
    table = prun.profile_model(model, f"{arch}_{flavor}", size, batch, classes,
                               optimizer="adam", progress=False)
    path = os.path.join(workdir, f"{arch}_{flavor}.json")
    tables.save_table(table, path)
    return path, {"tensors": len(table["tensors"]), "coverage": table["coverage"],
                  "unattributed_ops": len(table["unattributed"]),
                  "full_step_ms": table["t_full_ms"],
                  "forward_share": table["t_fp_ms"] / table["t_full_ms"],
                  "compile_ms": table["compile_ms"],
                  "estimated": sum(t["estimated"] for t in table["tensors"])}


def elastic_run(flavor, arch, size, batch, classes, table, args, workdir, repeat):
    import elastictrainer

    keras = keras_module(flavor)
    keras.utils.set_random_seed(repeat)
    model = build(keras, arch, size, classes)
    epochs = 3
    per_epoch = max(args.steps // epochs, 1)
    train, test = data(size, batch, classes, min(per_epoch, 32), seed=repeat)
    cfg = elastictrainer.Config(
        train_type="elastic_training", rho=args.rho, optimizer="adam", learning_rate=1e-3,
        num_epochs=epochs, steps_per_epoch=per_epoch, interval=1, timing_table=table,
        logdir=os.path.join(workdir, "logs"), run_name=f"{arch}_{flavor}_{repeat}",
        progress=False, seed=repeat, economy=False)
    summary = elastictrainer.run(cfg, model=model, data=(train, test), log=lambda m: None)
    return {"measured_ratio": summary["measured_ratio"], "wall_ratio": summary["wall_ratio"],
            "selected": summary["epochs"][-1]["selected"], "train_time_s": summary["train_time_s"]}


def fit_run(flavor, arch, size, batch, classes, table, args, workdir, repeat):
    """The same training through model.fit with ElasticCallback."""
    from elastictrainer.fit.callback import ElasticCallback

    keras = keras_module(flavor)
    keras.utils.set_random_seed(repeat)
    model = build(keras, arch, size, classes)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    epochs = 3
    per_epoch = max(args.steps // epochs, 1)
    train, test = data(size, batch, classes, min(per_epoch, 32), seed=repeat)
    out = os.path.join(workdir, "fit", f"{arch}_{flavor}_{repeat}")
    model.fit(train, epochs=epochs, steps_per_epoch=per_epoch, validation_data=test, verbose=0,
              callbacks=[ElasticCallback(rho=args.rho, interval=1, logdir=out, timing_table=table,
                                         economy=False, log=None)])
    summary = runlog.read_summary(out)
    return {"measured_ratio": summary["measured_ratio"], "wall_ratio": summary["wall_ratio"],
            "selected": summary["epochs"][-1]["selected"], "train_time_s": summary["train_time_s"]}


def _ratios(runs):
    ratios = [run["measured_ratio"] for run in runs if run["measured_ratio"]]
    if not ratios:
        return "n/a"
    return f"{statistics.median(ratios):.3f} ({', '.join(f'{v:.3f}' for v in ratios)})"


def markdown(results):
    head = results["machine"]
    lines = [f"Machine: {head}; run {results['date']}.", "",
             "| architecture | Keras | tensors | op time attributed | full step ms | forward / "
             "full | compiling a selection | elastic step ratio at rho "
             f"{results['rho']:g}, command line (runs) | the same in model.fit (runs) | "
             "tensors trained |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, cell in results["cells"].items():
        for flavor in KERASES:
            r = cell[flavor]
            p = r["profile"]
            shown, fit_shown = (_ratios(r[key]) for key in ("runs", "fit_runs"))
            lines.append(
                f"| {cell['architecture']} {cell['input_size']} px, batch {cell['batch_size']} | "
                f"{'Keras 3' if flavor == 'keras3' else 'tf-keras'} | {p['tensors']} | "
                f"{100 * p['coverage']:.1f}% | {p['full_step_ms']:.1f} | "
                f"{p['forward_share']:.2f} | {p['compile_ms']:.0f} ms | {shown} | {fit_shown} | "
                f"{r['runs'][-1]['selected']} of {p['tensors']} |")
    lines += ["", f"Each elastic run: {results['steps']} steps of Adam 1e-3 on random data, "
              "re-selecting every epoch of a third of them, with the cell's own timing table, "
              "through elastictrainer.run (the command line's loop) and through model.fit with "
              "ElasticCallback, with economy off (in runs this short the economy would not spend "
              "on measuring each selection's ratio); the two Kerases interleaved per repeat."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    unknown = [c for c in args.cells if c not in CELLS]
    if unknown:
        ap.error(f"unknown cell(s) {', '.join(unknown)}; valid: {', '.join(CELLS)}")
    from tqdm import tqdm

    workdir = tempfile.mkdtemp(prefix="et_bench_keras_")
    results = {"machine": machine_text(machine_info()), "date": datetime.date.today().isoformat(),
               "rho": args.rho, "steps": args.steps, "cells": {}}
    bar = tqdm(total=len(args.cells) * len(KERASES) * (1 + args.repeats), desc="bench_keras")
    for name in args.cells:
        arch, size, batch, classes = CELLS[name]
        cell = {"architecture": arch, "input_size": size, "batch_size": batch}
        tables = {}
        for flavor in KERASES:
            tables[flavor], prof = profile(flavor, arch, size, batch, classes, workdir)
            cell[flavor] = {"profile": prof, "runs": [], "fit_runs": []}
            bar.update(1)
        for repeat in range(args.repeats):
            for flavor in KERASES:
                for key, how in (("runs", elastic_run), ("fit_runs", fit_run)):
                    cell[flavor][key].append(how(flavor, arch, size, batch, classes,
                                                 tables[flavor], args, workdir, repeat))
                bar.update(1)
        results["cells"][name] = cell
    bar.close()
    text = markdown(results)
    perfdoc.write_benchmark(os.path.abspath(args.out), results, text)
    print(text)
    return 0


if __name__ == "__main__":
    from elastictrainer.errors import run_cli
    run_cli(main)
