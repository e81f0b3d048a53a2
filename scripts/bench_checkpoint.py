"""What a run's checkpoint costs: its size on disk and the time one save and one restore take,
for a model as `main.py` builds it (weights, optimizer slots, both input pipelines' positions).

    python scripts/bench_checkpoint.py --model_name resnet50 --input_size 224 --batch_size 4
"""
import os

from elastictrainer import errors
from elastictrainer.config import ArgumentParser


def build_parser():
    p = ArgumentParser(prog="bench_checkpoint.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_name", default="resnet50", help="built-in name or a .keras/.h5 file")
    p.add_argument("--input_size", type=int, default=224, help="image height and width")
    p.add_argument("--batch_size", type=int, default=4, help="training batch size")
    p.add_argument("--num_classes", type=int, default=200, help="classifier outputs")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="its slots are saved")
    p.add_argument("--saves", type=int, default=3, help="timed saves (median)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--out", default=None, help="JSON results (default: figures/bench_checkpoint_<model>.json)")
    return p


def run_benchmark(model_name, input_size, batch_size, num_classes, optimizer, saves, directory):
    import statistics
    import tempfile
    import time

    from elastictrainer.flavors import optimizers
    from elastictrainer.runs.checkpoint import RunCheckpoint
    from elastictrainer.data.loaders import load_dataset
    from elastictrainer.models.build import build_sized

    model, input_size, num_classes = build_sized(model_name, input_size, num_classes, "none")
    opt = optimizers.make_optimizer(optimizer, 1e-4, 5e-4, 1000)
    optimizers.prepare_optimizer(opt, model.trainable_weights)
    data = load_dataset("synthetic", input_size=input_size, batch_size=batch_size)
    iterators = {"train_data": iter(data.train.repeat()), "probe_data": iter(data.train.repeat())}
    for it in iterators.values():
        next(it)
    directory = directory or tempfile.mkdtemp(prefix="ckpt_bench_")
    ckpt = RunCheckpoint(directory, model, opt, iterators)
    state = {"loop": {"epoch": 1}, "summary": {"epochs": [{}] * 12}}
    times = []
    for k in range(saves):
        t0 = time.perf_counter()
        ckpt.save(state, k)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ckpt.restore()
    restore_s = time.perf_counter() - t0
    last = ckpt.latest
    size = sum(os.path.getsize(os.path.join(os.path.dirname(last), f))
               for f in os.listdir(os.path.dirname(last))
               if f.startswith(os.path.basename(last) + "."))
    params = sum(int(w.shape.num_elements()) for w in model.weights)
    return {"model": str(model_name), "input_size": input_size, "batch_size": batch_size,
            "optimizer": optimizer, "parameters": params, "checkpoint_mb": size / 2**20,
            "save_s": statistics.median(times), "save_s_all": times, "restore_s": restore_s,
            "directory": directory}


def main(argv=None):
    args = build_parser().parse_args(argv)
    res = run_benchmark(args.model_name, args.input_size, args.batch_size, args.num_classes,
                        args.optimizer, args.saves, args.dir)
    stem = os.path.splitext(os.path.basename(args.model_name))[0]
    out = args.out or os.path.join("figures", f"bench_checkpoint_{stem}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    from elastictrainer import runlog
    runlog.write_json(out, res)
    print(f"{res['model']} ({res['parameters'] / 1e6:.1f} M values) with {res['optimizer']}: "
          f"checkpoint {res['checkpoint_mb']:.0f} MB, save {res['save_s']:.2f} s (median of "
          f"{args.saves}), restore {res['restore_s']:.2f} s; written {out}")
    return 0


if __name__ == "__main__":
    errors.run_cli(main)
