"""The profile and figure commands' settings: ProfileConfig and FigureConfig, made as Config is
(each field carries its flag, so the parsers and their flag tables in docs/usage.md and
docs/reproducing.md are generated from them).  Their model and data flags are Config's fields,
taken with `same_as`, so they mean what they mean to train.
"""
import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

from elastictrainer.config.flags import check_positive, comma_list, flag, flag_of
from elastictrainer.config.settings import CONFIG_FIELDS
from elastictrainer.errors import UserError
from elastictrainer.models import DEFAULT_NUM_CLASSES


def same_as(name, **changes):
    """A field that is Config's `name` (its default and flag) in another command's settings,
    with `changes`: `default`, and Flag's fields (help, shown_default, ...)."""
    f = CONFIG_FIELDS[name]
    default = changes.pop("default", f.default)
    return field(default=default, metadata={"flag": dataclasses.replace(flag_of(f), **changes),
                                            "same_as": name})


@dataclass(frozen=True)
class ProfileConfig:
    """The profile command's settings (profiler/run.py's profile_configuration); the model's
    flags mean what they mean to train, except that it needs no data."""
    model_name: str = same_as("model_name")
    input_size: int = same_as("input_size")
    num_classes: Optional[int] = same_as(
        "num_classes", help="classifier outputs (a saved model file keeps its own unless "
                            "this is given: another count gets a new head, as in train)",
        shown_default=f"{DEFAULT_NUM_CLASSES}, as the paper's CUB-200")
    optimizer: str = same_as("optimizer")
    batch_size: int = same_as("batch_size", help="training batch size to profile")
    weights: str = same_as(
        "weights", default="none",
        help="imagenet | synthetic | none | PATH; timings do not depend on the values, so the "
             "default avoids a download")
    num_iterations: int = field(default=5, metadata=flag(
        "profiled training steps (also the most timed steps and calibration rounds, which "
        "stop after 3 once their repeats agree within 8%)"))
    calibrate: bool = field(default=True, metadata=flag(
        "also time a few real partial selections and fit separate t_dw / t_dy scales, so that "
        "rho holds when ops overlap (adds about 3 compiles and 10 steps per selection)"))
    warmup: int = field(default=2, metadata=flag("untimed warm-up steps"))
    output: Optional[str] = field(default=None, metadata=flag(
        "table path, where training looks for it",
        shown_default=flag_of(CONFIG_FIELDS["timing_table"]).shown_default))
    trace_dir: Optional[str] = field(default=None, metadata=flag(
        "where tf.profiler writes its trace, beside the runs: tensorboard --logdir logs shows "
        "it in its Profile tab", shown_default="logs/<table>_profile"))
    figure: Optional[str] = field(default=None, metadata=flag(
        "t_dw/t_dy bar chart ('' = none)", shown_default="figures/profile_<table>.png"))
    seed: int = same_as("seed", help="seed of the random profiling batch")
    progress: bool = same_as("progress")

    def validate(self):
        check_positive(self, ("input_size", "batch_size", "num_classes", "num_iterations"))
        if self.warmup < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup}")


def parse_resources(text):
    """'pi4=1,big_memory=0.5' -> {'pi4': 1.0, 'big_memory': 0.5} (an argparse type: a bad one is
    a usage error)."""
    resources = {}
    for item in str(text).split(","):
        if not item.strip():
            continue
        name, sep, amount = item.partition("=")
        name = name.strip()
        try:
            value = float(amount) if sep else 1.0
        except ValueError:
            value = -1.0
        if not name or value <= 0:
            raise argparse.ArgumentTypeError(
                f"expected NAME=N[,NAME=N] with N > 0 (a custom resource the nodes advertise), "
                f"got {text!r}")
        resources[name] = value
    if not resources:
        raise argparse.ArgumentTypeError(f"expected NAME=N[,NAME=N], got {text!r}")
    return resources


@dataclass(frozen=True)
class FigureConfig:
    """The figure command's settings (experiments/figures.py's Driver): which runs it starts,
    where they write, and where they run; the data flags mean what they mean to train."""
    ego: bool = field(default=False, metadata=flag(
        "ElasticTrainer runs only, no baselines (what the _ego scripts pass)", switch=True))
    smoke: bool = field(default=False, metadata=flag(
        "the smallcnn setting (smallcnn from --weights synthetic on synthetic data, 64 px, "
        "Adam): the whole pipeline in minutes (what SMOKE=1 passes)", switch=True))
    offline: bool = field(default=False, metadata=flag(
        "the paper's regime offline, each model on its own (experiments/protocols.py): "
        "efficientnet_lite0 from its ImageNet weights on synthetic_textures (the time-to-"
        "accuracy benchmark's efficientnet_textures), the backbones --weights synthetic "
        "pretrains on synthetic data (its mobilenetv2_paper), with the paper's SGD; and a table "
        "of each scheme against full training beside the paper's numbers (what OFFLINE=1 "
        "passes)", switch=True))
    seeds: tuple = field(default=(0,), metadata=flag(
        "comma-separated seeds; each run once per seed (the plots average them)",
        parse=comma_list(int, "integers"),
        shown_default="0"))
    logdir: Optional[str] = field(default=None, metadata=flag(
        "run directories",
        shown_default="logs/figures/FIG, smoke: logs/smoke/FIG, offline: logs/offline/FIG"))
    figdir: Optional[str] = field(default=None, metadata=flag(
        "figures", shown_default="figures/, smoke: figures/smoke/, offline: figures/offline/"))
    profiles: Optional[str] = field(default=None, metadata=flag(
        "timing tables", shown_default="profiles/"))
    data_dir: Optional[str] = same_as("data_dir")
    steps_per_epoch: Optional[int] = same_as(
        "steps_per_epoch", help="cap on every run's training steps per epoch, for a quick check "
                                "of the pipeline (the numbers then mean little)")
    num_test: Optional[int] = same_as(
        "num_test", help="every run's test images (generated datasets only), for a quick check "
                         "of the pipeline: each epoch is evaluated on all of them, which then "
                         "costs more than its steps (the numbers then mean little)",
        shown_default="the protocol's")
    cache_frozen_prefix: Union[bool, str] = same_as(
        "cache_frozen_prefix", default=False,
        help="every training run's --cache_frozen_prefix: false keeps the paper's protocol, "
             "where every step runs the whole forward pass; auto or true lets the runs cache as "
             "train does (not the paper's protocol: runs and figures then go under names ending "
             "in _cacheauto or _cachetrue)")
    dry_run: bool = field(default=False, metadata=flag(
        "print the commands, run nothing (with --ray: contact no cluster)", switch=True))
    ray: Optional[str] = field(default=None, metadata=flag(
        "run every profiling and training run as a Ray task on the cluster at ADDRESS "
        "(HOST:PORT of its head, which starting it prints; auto: the cluster this "
        "machine belongs to; local: start one here, a run per core): profiling first, then "
        "the runs, each retried once; run directories come back into --logdir here and the "
        "figures are drawn here (needs pip install .[cluster])", metavar="ADDRESS",
        shown_default="off: the runs run here, one after another"))
    ray_resources: Optional[dict] = field(default=None, metadata=flag(
        "NAME=N[,NAME=N], with --ray: run only on nodes that advertise these custom resources "
        "(give each Pi's Ray the custom resource pi4 = 1, then pi4=1: one run at a time per "
        "board); timing tables go to PROFILES/NAME", metavar="NAME=N[,NAME=N]",
        parse=parse_resources, shown_default="any node"))

    def validate(self):
        check_positive(self, ("steps_per_epoch", "num_test"))
        if self.smoke and self.offline:
            raise UserError("--smoke and --offline are two protocols: give one of them")
        if self.ray_resources and not self.ray:
            raise UserError("--ray_resources pins runs to a Ray cluster's nodes: it needs --ray")
