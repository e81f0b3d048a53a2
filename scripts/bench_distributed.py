"""ElasticTrainer on more than one device: step time, measured step ratio and all-reduced
gradient bytes per step against rho, on 2 logical CPU devices (--strategy mirrored
--logical_cpus 2) and on 2 worker processes on this machine (--strategy multi_worker).

Each cell is a `main.py` run (full training, then ElasticTrainer at each rho) of smallcnn from
--weights synthetic on the synthetic data, the same global batch on every topology.  A run's
step time is its training time over its steps; the measured ratio is the elastic run's own
(its steps against full steps timed in the same run, all-reduce included); the all-reduced
bytes are summary.json's (the selected tensors' gradients each step moves, probes and timed
full steps moving every gradient).  On a machine of few cores the replicas share them, so the
step times say what the all-reduce and the selection cost there, not what separate devices
would gain.

    python scripts/bench_distributed.py            # about 2 minutes on 2 cores
    python scripts/bench_distributed.py --rhos 0.5 --epochs 2 --out /tmp/d   # a quick look

Writes figures/bench_distributed.{md,json} (and its block of docs/performance.md).
"""
import datetime
import os
import subprocess
import sys
import tempfile

from elastictrainer import runlog
from elastictrainer.experiments import perfdoc
from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.machine import machine_info, machine_text
from elastictrainer.train.distribution import local_cluster

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGIES = {
    "2 logical CPUs (mirrored)": ["--strategy", "mirrored", "--logical_cpus", "2"],
    "2 workers on localhost (multi_worker)": ["--strategy", "multi_worker"],
}


def build_parser():
    p = ArgumentParser(prog="bench_distributed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rhos", default="0.5,0.7", type=comma_list(float),
                   help="the elastic runs' rho values")
    p.add_argument("--epochs", type=int, default=3, help="epochs of every run")
    p.add_argument("--steps_per_epoch", type=int, default=40, help="steps per epoch")
    p.add_argument("--input_size", type=int, default=64, help="image height and width")
    p.add_argument("--batch_size", type=int, default=32, help="the global batch")
    p.add_argument("--out", default=os.path.join(HERE, "figures", "bench_distributed"),
                   help="output path without extension (.json and .md are written)")
    return p


def run(args, workdir, topology, name, train_type, rho):
    """One run on `topology`; its summary.json (the chief's)."""
    cmd = [sys.executable, os.path.join(HERE, "main.py"), "--model_name", "smallcnn",
           "--weights", "synthetic", "--dataset_name", "synthetic", "--num_train", "2048",
           "--num_test", "256", "--input_size", str(args.input_size), "--batch_size",
           str(args.batch_size), "--optimizer", "adam", "--learning_rate", "0.001",
           "--num_epochs", str(args.epochs), "--steps_per_epoch", str(args.steps_per_epoch),
           "--interval", "1", "--rho", f"{rho:g}", "--train_type", train_type,
           "--timing_table", os.path.join(workdir, "table.json"), "--logdir",
           os.path.join(workdir, "logs"), "--run_name", name, "--quiet",
           "--energy", "none", "--economy", "false"] + TOPOLOGIES[topology]
    if "multi_worker" in cmd:
        procs = [subprocess.Popen(cmd, env=dict(os.environ, TF_CONFIG=config),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for config in local_cluster(2)]
        errors = [p.communicate()[1] for p in procs]
        codes = [p.returncode for p in procs]
    else:
        done = subprocess.run(cmd, capture_output=True, text=True)
        errors, codes = [done.stderr], [done.returncode]
    if any(codes):
        raise SystemExit(f"{name} failed: {errors[0][-1500:]}")
    return runlog.read_summary(os.path.join(workdir, "logs", name))


def markdown(results):
    lines = [f"Machine: {results['machine']}; run {results['date']}.", "",
             "| devices | run | step ms | measured step ratio | all-reduced per step | of full "
             "training's | best accuracy |",
             "|---|---|---|---|---|---|---|"]
    for topology, rows in results["topologies"].items():
        for row in rows:
            ratio = row["measured_ratio"]
            lines.append(
                f"| {topology} | {row['run']} | {row['step_ms']:.1f} | "
                f"{'' if ratio is None else f'{ratio:.3f}'} | "
                f"{row['allreduce_kb']:.0f} KB | {row['allreduce_share']:.2f} | "
                f"{row['best_accuracy']:.1f}% |")
    lines += ["", f"smallcnn from --weights synthetic, {results['input_size']} px, global batch "
              f"{results['batch_size']}, Adam 1e-3, {results['epochs']} epochs x "
              f"{results['steps_per_epoch']} steps, re-selecting every epoch, --economy false "
              "(a run this short would not spend on measuring each selection's ratio "
              "otherwise); step ms is "
              "training time over steps (probes, timed full steps and compiles included)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = build_parser().parse_args(argv)
    from tqdm import tqdm

    workdir = tempfile.mkdtemp(prefix="et_bench_dist_")
    results = {"machine": machine_text(machine_info()), "date": datetime.date.today().isoformat(),
               "input_size": args.input_size, "batch_size": args.batch_size,
               "epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch,
               "topologies": {}}
    cells = [("full training", "full_training", 1.0)] + [
        (f"ElasticTrainer rho {rho:g}", "elastic_training", rho) for rho in args.rhos]
    bar = tqdm(total=len(TOPOLOGIES) * len(cells), desc="bench_distributed")
    for t, topology in enumerate(TOPOLOGIES):
        rows = []
        for c, (label, train_type, rho) in enumerate(cells):
            summary = run(args, workdir, topology, f"t{t}_c{c}", train_type, rho)
            steps = len(summary["epochs"]) * summary["steps_per_epoch"]
            full = summary["full_allreduce_bytes_per_step"]
            rows.append({"run": label, "rho": None if train_type == "full_training" else rho,
                         "step_ms": 1e3 * summary["train_time_s"] / steps,
                         "measured_ratio": summary["measured_ratio"],
                         "allreduce_kb": summary["allreduce_bytes_per_step"] / 1024,
                         "allreduce_share": summary["allreduce_bytes_per_step"] / full,
                         "best_accuracy": summary["best_test_accuracy"],
                         "replicas_agree": summary["replicas_agree"], "summary": summary})
            bar.update(1)
        results["topologies"][topology] = rows
    bar.close()
    text = markdown(results)
    perfdoc.write_benchmark(os.path.abspath(args.out), results, text)
    print(text)
    return 0


if __name__ == "__main__":
    from elastictrainer.errors import run_cli
    run_cli(main)
