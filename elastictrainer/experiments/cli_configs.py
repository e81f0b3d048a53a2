"""The time-to-accuracy benchmark's command-line configurations (scripts/bench_time_to_accuracy.py):
each one's Config fields, where its last stage begins (the hand-frozen baseline trains from
there to the output), its epochs and its baselines; and a configuration's grid of schemes, as
the benchmark's flags ask for it (full training, the baselines, the last stage uncached and
cached, ElasticTrainer at each rho and with --rho auto).  The settings of the paper's regime,
and why they are what they are, are experiments/protocols.py's.  No TensorFlow."""
import dataclasses

from elastictrainer.experiments.protocols import (
    IMAGENET_LAST_STAGE, IMAGENET_TARGETS, OFFLINE, OFFLINE_DATASET, OFFLINE_MODEL, config_fields)
from elastictrainer.method.schemes import register_fixed_from


@dataclasses.dataclass(frozen=True)
class Setup:
    """A command-line configuration: its Config fields, the first tensor of its last stage (the
    hand-frozen baseline trains it to the output), its epochs, and the baselines it runs beyond
    full training, traditional TL and the last stage."""
    fields: dict
    last_stage: int
    epochs: int = 12
    baselines: tuple = ()
    # every elastic run again with --cache_frozen_prefix false, beside the default cache
    uncached_too: bool = False


def _imagenet_setup(protocol, dataset):
    """The ImageNet backbone under `protocol` on `dataset`, with BN+Bias and PruneTrain."""
    return Setup(config_fields(protocol, dataset), IMAGENET_LAST_STAGE,
                 epochs=protocol.num_epochs, baselines=("bn_plus_bias_training", "prunetrain"))


CONFIGS = {
    "smallcnn": Setup(dict(model_name="smallcnn", weights="synthetic", dataset_name="synthetic",
                           num_train=4800, num_test=1024, input_size=64, batch_size=32,
                           optimizer="adam", learning_rate=0.001), 12),
    "smallcnn32": Setup(dict(model_name="smallcnn", weights="synthetic", dataset_name="synthetic",
                             num_train=4000, num_test=1024, input_size=32, batch_size=8,
                             optimizer="adam", learning_rate=0.001), 12),
    # The paper's regime (docs/performance.md): the figures' OFFLINE protocol, whose settings
    # (and why they are what they are) are experiments/protocols.py's
    "mobilenetv2_paper": Setup(dict(model_name=OFFLINE_MODEL, weights=OFFLINE.weights,
                                    dataset_name=OFFLINE_DATASET,
                                    num_train=OFFLINE.extra["num_train"],
                                    num_test=OFFLINE.extra["num_test"],
                                    input_size=OFFLINE.input_size,
                                    batch_size=OFFLINE.batch_size, optimizer=OFFLINE.optimizer,
                                    learning_rate=OFFLINE.learning_rate), 134,
                               epochs=OFFLINE.num_epochs, baselines=("bn_plus_bias_training",)),
    # The paper's regime on a real ImageNet backbone: its calibrated texture target and the
    # first target tried (protocols.IMAGENET_TARGETS)
    **{name: _imagenet_setup(protocol, dataset)
       for name, (protocol, dataset) in IMAGENET_TARGETS.items()},
    # From random weights every layer must learn: does the default cache freeze a prefix that
    # still needs to?  Its elastic runs run uncached too, the yardstick of that question.
    "smallcnn_scratch": Setup(dict(model_name="smallcnn", weights="none",
                                   dataset_name="synthetic", num_train=4800, num_test=1024,
                                   input_size=96, batch_size=32, optimizer="adam",
                                   learning_rate=0.001), 12, epochs=4, uncached_too=True),
}

# The paper regime's fine-tune across a domain shift, on the command line: the target's gratings
# rotated, their colours permuted and inverted, noise added (data/domain_shift.py), so that the
# layers that see pixels must move (model.fit's domain_shift_fit on the CLI)
CONFIGS["domain_shift_cli"] = dataclasses.replace(
    CONFIGS["mobilenetv2_paper"], baselines=(),
    fields={**CONFIGS["mobilenetv2_paper"].fields, "dataset_name": "synthetic_shifted"})


# --rho auto's schemes run again with one setting changed, each under its benchmark flag:
# (flag, label suffix, settings changed (Config's and ElasticCallback's names alike), help)
AUTO_AGAIN = (
    ("pace_too", "pace check", {"pace_check": True},
     "--pace_check true: widened towards full training when it trains more slowly per second "
     "than full training would"),
    ("economy_off_too", "economy off", {"economy": False},
     "--economy false: re-selected at every interval, whatever the re-selection overhead"),
    ("trial_check_too", "trial check", {"trial_check": True},
     "--trial_check true: the estimated loss drop scaled, depth by depth, by what a trial "
     "step of each depth realizes"),
)


def auto_again(args, schemes, is_auto):
    """Each of `schemes` ((label, kind, settings)) whose settings is_auto selects, again under
    each AUTO_AGAIN flag `args` sets, labelled and changed as that flag says; a changed run
    that `schemes` already holds (a configuration's own trial-checked run, say) is not added
    a second time."""
    held = [(kind, settings) for _, kind, settings in schemes]
    return [(f"{label}, {suffix}", kind, {**settings, **changed})
            for flag, suffix, changed, _ in AUTO_AGAIN if getattr(args, flag, False)
            for label, kind, settings in schemes
            if is_auto(settings) and (kind, {**settings, **changed}) not in held]


def cli_schemes(name, args):
    """[(scheme, train_type, Config fields)] of command-line configuration `name`'s grid, its
    reference (full training) first."""
    setup = CONFIGS[name]
    first = setup.last_stage
    fixed = register_fixed_from(first)
    runs = [("full_training", "full_training", {})]
    if not args.elastic_only:
        runs += [("traditional_tl_training", "traditional_tl_training", {})]
        runs += [(scheme, scheme, {}) for scheme in setup.baselines]
        runs += [(f"last stage (tensors {first}-)", fixed, {"cache_frozen_prefix": False}),
                 (f"last stage (tensors {first}-), cached", fixed,
                  {"cache_frozen_prefix": "auto"})]
    runs += [(f"ElasticTrainer rho {rho:g}", "elastic_training", {"rho": rho})
             for rho in args.rhos]
    if getattr(args, "tolerance", None):
        runs += [(f"ElasticTrainer rho {rho:g}, tolerance {args.tolerance:g}",
                  "elastic_training", {"rho": rho, "rho_tolerance": args.tolerance})
                 for rho in args.rhos]
    runs += [(f"ElasticTrainer rho auto, share {share:g}", "elastic_training",
              {"rho": "auto", "rho_share": share}) for share in args.shares]
    if args.rate:
        runs.append(("ElasticTrainer rho auto, rate", "elastic_training",
                     {"rho": "auto", "rho_objective": "rate"}))
    if getattr(args, "gain", False):
        runs.append(("ElasticTrainer rho auto, gain", "elastic_training",
                     {"rho": "auto", "rho_objective": "gain"}))
    runs += auto_again(args, runs, lambda extra: extra.get("rho") == "auto")
    elastic = [run for run in runs if run[1] == "elastic_training"]
    if setup.uncached_too or getattr(args, "uncached_too", False):
        runs += [(f"{label}, uncached", kind, {**extra, "cache_frozen_prefix": False})
                 for label, kind, extra in elastic]
    views = getattr(args, "views_too", None)
    if views:
        runs += [(f"{label}, {views} views cached", kind,
                  {**extra, "cache_frozen_prefix": True, "cache_views": views})
                 for label, kind, extra in elastic]
    return runs
