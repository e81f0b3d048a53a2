"""The prefix cache's augmented views against fresh augmentation, on the ImageNet backbone.

Usage (from the repo root; figures/bench_cache_views.{json,md} came from `--configs
efficientnet_imagenet,efficientnet_textures --seeds 0,1,2 --views 0,1,2,4`, about 3.5 minutes
a run on 2 cores):
    python scripts/bench_cache_views.py [--configs efficientnet_imagenet] [--seeds 0]
        [--views 0,1,2,4] [--logdir logs/bench_cache_views]
        [--out figures/bench_cache_views.json]

The built-in models flip and rotate their input at random, before the first weights.  A run
without the cache draws a fresh view of every training image each epoch; the cache keeps
--cache_views views of each image, stored by the first passes over the data, and trains every
later epoch on one of them drawn at random (docs/design.md).  With few training images the
views a run sees are part of what it learns from.  Each configuration (EfficientNet-Lite0 with
its ImageNet weights, protocols.IMAGENET_TARGETS, under --bn_mode frozen, which leaves a cut
above the frozen BatchNorm layers) is run with its last stage and head held fixed (the
hand-frozen baseline), once per --views entry: 0 is uncached (fresh augmentation), K caches K
views.  The table gives each run's best test
accuracy, the points it is under the uncached run of its seed, and its training time over that
run's.  Finished runs in --logdir of the same settings are read, not run again.
"""
import datetime
import os
import statistics

from elastictrainer.config import ArgumentParser, comma_list  # no TensorFlow: --help stays quick
from elastictrainer.errors import UserError, run_cli
from elastictrainer.experiments import perfdoc, recorded
from elastictrainer.experiments.protocols import (IMAGENET_LAST_STAGE, IMAGENET_TARGETS,
                                                  config_fields)
from elastictrainer.machine import machine_info, machine_text
from elastictrainer.method.schemes import register_fixed_from

BN_MODE = "frozen"


def build_parser():
    ap = ArgumentParser(prog="bench_cache_views.py", description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="efficientnet_imagenet", type=comma_list(str, "names"),
                    help="bench_time_to_accuracy.py's ImageNet configurations: "
                    + ", ".join(IMAGENET_TARGETS))
    ap.add_argument("--seeds", default="0", type=comma_list(int, "integers"), help="seeds")
    ap.add_argument("--views", default="0,1,2,4", type=comma_list(int, "integers"),
                    help="views the cache keeps, one run each; 0: uncached")
    ap.add_argument("--logdir", default="logs/bench_cache_views", help="where runs go")
    ap.add_argument("--out", default="figures/bench_cache_views.json",
                    help="JSON results; a Markdown table is written beside it (.md)")
    return ap


def run_name(views, seed):
    return f"uncached_seed{seed}" if views == 0 else f"views{views}_seed{seed}"


def config(name, views, seed, logdir):
    """The Config of one run: `name`'s fields, its last stage fixed, `views` (0: uncached)."""
    import elastictrainer

    protocol, dataset = IMAGENET_TARGETS[name]
    cache = (dict(cache_frozen_prefix=False) if views == 0 else
             dict(cache_frozen_prefix="auto", cache_views=views))
    return elastictrainer.Config(**{**config_fields(protocol, dataset), "bn_mode": BN_MODE},
                                 num_epochs=protocol.num_epochs, seed=seed,
                                 train_type=register_fixed_from(IMAGENET_LAST_STAGE),
                                 logdir=os.path.join(logdir, name), progress=False,
                                 resume=True, run_name=run_name(views, seed), **cache)


def one_run(name, views, seed, logdir):
    """{best, train_s} of one run, read back when it finished before."""
    import elastictrainer

    cfg = config(name, views, seed, logdir)
    summary = recorded.finished_run(cfg)
    if summary is None:
        print(f"--- {name} seed {seed}: {run_name(views, seed)}", flush=True)
        summary = elastictrainer.run(cfg, log=lambda m: None)
    tested = [e for e in summary["epochs"] if e.get("test_accuracy") is not None]
    return {"best": max(e["test_accuracy"] for e in tested),
            "train_s": tested[-1]["train_time_s"]}


def label(views):
    return "uncached (fresh views)" if views == 0 else f"{views} view{'s' * (views > 1)} cached"


def _mean(values, fmt):
    return fmt.format(statistics.mean(values)) if values else "n/a"


def table(runs, views, seeds):
    """Markdown: a row per views setting; a column per seed (best, points under the uncached
    run of that seed), the mean points under and the mean time over the uncached run's."""
    head = (["views", *[f"seed {s}" for s in seeds], "mean points under uncached",
             "training time / uncached's"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in views:
        cells, under, ratio = [], [], []
        for s in seeds:
            r, ref = runs[f"{v}/{s}"], runs.get(f"0/{s}")
            if ref is None:
                cells.append(f"{r['best']:.1f}%")
                continue
            under.append(ref["best"] - r["best"])
            ratio.append(r["train_s"] / ref["train_s"])
            cells.append(f"{r['best']:.1f}% ({under[-1]:+.1f})")
        lines.append("| " + " | ".join([label(v), *cells, _mean(under, "{:+.1f}"),
                                        _mean(ratio, "{:.2f}")]) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    unknown = [c for c in args.configs if c not in IMAGENET_TARGETS]
    if unknown:
        raise UserError(f"unknown configuration {unknown[0]!r}; valid: "
                        f"{', '.join(IMAGENET_TARGETS)}")
    if any(v < 0 for v in args.views):
        raise UserError("--views must be >= 0 (0: uncached)")
    views = sorted(set(args.views))
    results = {name: {f"{v}/{s}": one_run(name, v, s, args.logdir)
                      for s in args.seeds for v in views} for name in args.configs}
    when = datetime.date.today().isoformat()
    flags = (f"--configs {','.join(args.configs)} --seeds {','.join(map(str, args.seeds))} "
             f"--views {','.join(map(str, views))}")
    text = (f"Machine: {machine_text(machine_info())}; {when}; "
            f"`python scripts/bench_cache_views.py {flags}`.\n\n")
    for name, runs in results.items():
        text += (f"**{name}**, its last stage (tensors {IMAGENET_LAST_STAGE}-) fixed, "
                 f"`--bn_mode {BN_MODE}`, {IMAGENET_TARGETS[name][0].num_epochs} epochs: best "
                 f"test accuracy (points under the uncached run of the seed)\n\n"
                 f"{table(runs, views, args.seeds)}\n\n")
    print(text)
    perfdoc.write_benchmark(os.path.splitext(args.out)[0],
                            {"date": when, "machine": machine_info(), "flags": flags,
                             "views": views, "seeds": args.seeds, "results": results}, text)


if __name__ == "__main__":
    run_cli(main)
