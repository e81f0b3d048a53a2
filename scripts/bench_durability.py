"""What making a run's files durable costs, as a share of its training time: every fsync
(checkpoints, their sums and index, summary.json, config.json, the prefix cache's files), the
checksums of each checkpoint's files, and writing the prefix cache's store down for the
checkpoints (its rows once each), on one run as `main.py` trains it.

    python scripts/bench_durability.py        # the paper's regime: MobileNetV2, 96 px, batch 8

The run is timed by wrapping os.fsync, the checkpoints' sealing and the cache's state at each
checkpoint from outside; the training itself is the command line's loop, unchanged.
"""
import os
import time

from elastictrainer import errors
from elastictrainer.config import ArgumentParser


def build_parser():
    p = ArgumentParser(prog="bench_durability.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_name", default="mobilenetv2", help="built-in model")
    p.add_argument("--input_size", type=int, default=96, help="image height and width")
    p.add_argument("--batch_size", type=int, default=8, help="training batch size")
    p.add_argument("--num_train", type=int, default=2000, help="synthetic training images")
    p.add_argument("--num_epochs", type=int, default=3, help="epochs (a checkpoint at each end)")
    p.add_argument("--rho", type=float, default=0.4, help="ElasticTrainer's step-time ratio")
    p.add_argument("--logdir", default=os.path.join("logs", "bench_durability"),
                   help="where the run writes (its disk is the one measured)")
    p.add_argument("--out", default=os.path.join("figures", "bench_durability.json"),
                   help="JSON results")
    return p


def shares(timed, train_time_s):
    """Each timed part's seconds and share of the training time, and their sum."""
    parts = {name: {"s": s, "share": s / train_time_s} for name, s in timed.items()}
    total = sum(timed.values())
    return {"parts": parts, "total_s": total, "total_share": total / train_time_s}


def run_benchmark(args):
    from elastictrainer import config
    from elastictrainer.prefix.cache import PrefixCache
    from elastictrainer.runs import checkpoint_files, loop

    timed = {"other fsyncs": 0.0, "checkpoint checksums and fsync": 0.0, "cache store written down": 0.0}

    inside = []  # a part timed within another (sealing's fsyncs) is counted in the outer one

    def timing(name, fn):
        def wrapper(*a, **kw):
            if inside:
                return fn(*a, **kw)
            inside.append(name)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timed[name] += time.perf_counter() - t0
                inside.pop()
        return wrapper

    originals = (os.fsync, checkpoint_files.seal, PrefixCache.state)
    os.fsync = timing("other fsyncs", os.fsync)
    checkpoint_files.seal = timing("checkpoint checksums and fsync", checkpoint_files.seal)
    PrefixCache.state = timing("cache store written down", PrefixCache.state)
    try:
        cfg = config.Config(
            model_name=args.model_name, weights="synthetic", dataset_name="synthetic",
            num_train=args.num_train, num_test=512, input_size=args.input_size,
            batch_size=args.batch_size, optimizer="sgd", learning_rate=0.001, rho=args.rho,
            num_epochs=args.num_epochs, logdir=args.logdir, run_name="run", resume=False,
            seed=0, progress=False)
        summary = loop.run(cfg, log=lambda m: None)
    finally:
        os.fsync, checkpoint_files.seal, PrefixCache.state = originals
    pc = summary["prefix_cache"] or {}
    return {"settings": {k: getattr(args, k) for k in ("model_name", "input_size", "batch_size",
                                                       "num_train", "num_epochs", "rho")},
            "train_time_s": summary["train_time_s"], "checkpoints": len(summary["epochs"]),
            "cache_store_mb": max((b["bytes"] for b in pc.get("builds", [])), default=0) / 2**20,
            **shares(timed, summary["train_time_s"])}


def main(argv=None):
    args = build_parser().parse_args(argv)
    from elastictrainer import runlog
    from elastictrainer.machine import machine_info

    res = dict(run_benchmark(args), machine=machine_info(), date=time.strftime("%Y-%m-%d"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    runlog.write_json(args.out, res)
    parts = ", ".join(f"{name} {p['s']:.2f} s ({100 * p['share']:.1f}%)"
                      for name, p in res["parts"].items())
    print(f"{args.model_name}, {res['checkpoints']} checkpoints over {res['train_time_s']:.1f} s "
          f"of training: {parts}; written {args.out}")
    return 0


if __name__ == "__main__":
    errors.run_cli(main)
