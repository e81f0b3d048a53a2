"""Tensor Timing Profiler: `python profiler.py --model_name resnet50 --num_classes 200`.

Runs a few training steps of the full model under the TensorFlow profiler and writes the
per-tensor timing table that ElasticTrainer's tensor selector uses (see tensor_timing.py).
"""
import common
from common import ArgumentParser, str2bool


def build_parser():
    p = ArgumentParser(
        prog="profiler.py",
        description="Profile per-tensor backward times (t_dw, t_dy) and forward/full step times "
                    "of a model on this device, and write them as a JSON timing table.")
    p.add_argument("--model_name", default="resnet50",
                   help="resnet50 | vgg16 | mobilenetv2 | vit, or a path to your own saved "
                        "Keras model (.keras or .h5)")
    p.add_argument("--input_size", type=int, default=224, help="image height and width")
    p.add_argument("--batch_size", type=int, default=4, help="training batch size to profile")
    p.add_argument("--num_classes", type=int, default=None,
                   help="classifier outputs (default: 200, as the paper's CUB-200; a saved model "
                        "file keeps its own)")
    p.add_argument("--weights", default="none",
                   help="imagenet | none | PATH; timings do not depend on the values, so the "
                        "default avoids a download")
    p.add_argument("--num_iterations", type=int, default=5,
                   help="profiled training steps (also the number of timed steps)")
    p.add_argument("--calibrate", type=str2bool, default=True,
                   help="also time a few real partial selections and fit separate t_dw / t_dy "
                        "scales, so that rho holds when ops overlap (default true; adds about "
                        "3 compiles and 10 steps per selection)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    p.add_argument("--output", default=None,
                   help="table path (default: profiles/<model>_i<input>_b<batch>_c<classes>.json, "
                        "where main.py looks for it)")
    p.add_argument("--trace_dir", default=None,
                   help="where tf.profiler writes its trace (default: profiles/traces/<table "
                        "name>; open it with `tensorboard --logdir` and the Profile tab)")
    p.add_argument("--figure", default=None,
                   help="t_dw/t_dy bar chart (default figures/profile_<table name>.png; '' = none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random profiling batch")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    for flag in ("input_size", "batch_size", "num_classes", "num_iterations"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise common.UserError(f"--{flag} must be a positive integer")
    if args.warmup < 0:
        raise common.UserError("--warmup must be >= 0")
    import tensor_timing

    table, path = tensor_timing.profile_configuration(
        args.model_name, args.input_size, args.batch_size, args.num_classes, args.weights,
        args.num_iterations, args.warmup, args.output, args.trace_dir, args.figure, args.seed,
        progress=not args.quiet, calibrate=args.calibrate)
    print(tensor_timing.summarize(table))
    print(f"timing table written to {path}")
    return 0


if __name__ == "__main__":
    common.run_cli(main)
