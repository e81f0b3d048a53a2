"""Setting a run up: its data, its model, its compiled steps and, for the elastic schemes, its time
model (the profiler's table, profiled first where missing).  Everything the loop (loop.py)
needs before its first step, checked before minutes of loading and profiling are spent."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import math
import os
import shutil
import time
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from elastictrainer import flavors, runlog
from elastictrainer.flavors import batchnorm, optimizers
from elastictrainer.train import distribution
from elastictrainer.runs import disk, room
from elastictrainer.runs.checkpoint import CHECKPOINT_DIR, check_same_run
from elastictrainer.elastic.budget import AUTO
from elastictrainer.errors import UserError, check_writable_dir
from elastictrainer.data.loaders import DatasetBundle, load_dataset
from elastictrainer.models.build import build_sized
from elastictrainer.profiler import calibration, table as tables
from elastictrainer.profiler.run import load_or_profile
from elastictrainer.method.roles import check_roles, tensor_roles
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.method.time_model import TimeModel
from elastictrainer.prefix.plan import why_not_distributed
from elastictrainer.train.compiled import CompiledSteps


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """A run ready to train (setup_run), as one value: nothing changes it after setup, and its
    `cfg` is the run's settings resolved (the model's name, input size and class count, the
    data's batch size, the run's name), as config.json saves them."""
    cfg: Any
    scheme: Any
    bundle: DatasetBundle
    model: Any
    compiled: CompiledSteps
    roles: list
    steps_per_epoch: int
    total_steps: int
    out: str
    resume: bool
    dist: Any  # distribution.Distribution
    time_model: Optional[TimeModel] = None
    table: Optional[dict] = None
    table_path: Optional[str] = None
    prefix_cache: Any = None  # prefix.cache.PrefixCache (--cache_frozen_prefix)
    bn_forced: tuple = ()  # the BatchNorm layers --bn_mode inference forced (batchnorm.restore)
    bn_hold: object = None  # --bn_mode frozen's batchnorm.FrozenHold (released at the end)
    profiling_s: float = 0.0  # seconds spent profiling the timing table first (0: read one)


def setup_run(cfg, log=print, model=None, data=None, clock=time.perf_counter):
    """Validate `cfg`, load data and model, build the compiled steps and the time model; see
    run() (clock: the run's, which also times the prefix cache's fills).  Returns a
    RunSetup."""
    cfg.validate()
    check_writable_dir(cfg.logdir, "--logdir")  # before minutes of loading and profiling
    dist = distribution.configure(cfg)  # before TensorFlow makes its devices
    scheme = SCHEMES[cfg.train_type]
    flavors.set_random_seed(cfg.seed)
    if data is not None:
        bundle, batch_size = user_data(data, model, cfg)
        cfg = dataclasses.replace(cfg, dataset_name=bundle.name, batch_size=batch_size)
    else:
        sizes = {k: getattr(cfg, k) for k in ("num_train", "num_test")
                 if getattr(cfg, k) is not None}
        bundle = load_dataset(cfg.dataset_name, input_size=cfg.input_size,
                              batch_size=cfg.batch_size, seed=cfg.seed, data_dir=cfg.data_dir,
                              **sizes)
    num_classes = cfg.num_classes or bundle.num_classes
    if num_classes < bundle.num_classes:
        raise UserError(f"--num_classes {num_classes} is smaller than the {bundle.num_classes} "
                        f"classes of {cfg.dataset_name}")
    if dist.on and model is None and cfg.weights == "synthetic":
        from elastictrainer.models.pretrain import ensure_synthetic

        ensure_synthetic(cfg.model_name, cfg.input_size, log=log, progress=cfg.progress)
    try:
        with dist.scope():  # model, optimizer and trainer variables mirrored under a strategy
            return _setup_in_scope(cfg, log, model, bundle, num_classes, scheme, dist, clock)
    except BaseException:
        if model is not None:  # a model given leaves a failed setup as it came (--bn_mode)
            batchnorm.restore(batchnorm.forced_layers(model))
        raise


def _setup_in_scope(cfg, log, model, bundle, num_classes, scheme, dist, clock):
    given_model = model is not None
    if given_model:
        if not flavors.is_model(model):
            raise UserError(f"model must be a Keras Model (tf_keras or Keras 3), got "
                            f"{type(model).__module__}.{type(model).__name__}")
        input_size, num_classes = int(model.input_shape[1]), int(model.output_shape[-1])
        # the model says its input size and classes: the settings follow it
        model_name, weights = model.name, "(model object)"
        cfg = dataclasses.replace(cfg, input_size=input_size)
    else:
        # a saved model with another class count gets a new head (models/build.py)
        model, input_size, num_classes = build_sized(cfg.model_name, cfg.input_size,
                                                     num_classes, cfg.weights, log=log,
                                                     progress=cfg.progress)
        model_name, weights = cfg.model_name, cfg.weights
    if input_size != cfg.input_size:
        raise UserError(f"{model_name} takes {input_size}x{input_size} images; "
                        f"pass --input_size {input_size}")
    if num_classes < bundle.num_classes:
        raise UserError(f"{model_name} outputs {num_classes} classes but "
                        f"{cfg.dataset_name} has {bundle.num_classes}")
    cfg = dataclasses.replace(cfg, model_name=model_name, weights=weights,
                              num_classes=num_classes)
    cfg = dataclasses.replace(cfg, run_name=cfg.resolved_run_name())  # from the values above

    # under a strategy an epoch is whole global batches (distribution.global_batches)
    whole = math.floor if dist.on else math.ceil
    steps_per_epoch = whole(bundle.num_train / cfg.batch_size) if bundle.num_train else None
    if cfg.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch or cfg.steps_per_epoch, cfg.steps_per_epoch)
    total_steps = steps_per_epoch * cfg.num_epochs
    out = runlog.run_dir(cfg.logdir, cfg.run_name)
    if dist.is_chief:  # before the table is read or profiled
        room.check_room(model, cfg, out, scheme.elastic, log)
    # before anything traces the model: its profile, cut points and steps see the mode
    bn_forced = tuple(batchnorm.apply(model, cfg.bn_mode))
    said = batchnorm.describe(model, cfg.bn_mode)
    if said:
        log(said)
    rng_state = random_state(model)
    roles = check_roles(tensor_roles(model))
    optimizer = optimizers.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
                                          total_steps, schedule=cfg.lr_schedule,
                                          flavor=flavors.for_model(model).NAME)
    cache = None
    why_not = _why_uncached(cfg, scheme, dist)
    if why_not:
        log(f"prefix cache off (--cache_frozen_prefix auto): {why_not}")
    elif cfg.cache_frozen_prefix:
        from elastictrainer.prefix.plan import plan as plan_cache

        examples = bundle.num_train or steps_per_epoch * cfg.batch_size
        cache = plan_cache(model, list(model.trainable_weights), cfg, examples, out, log,
                           clock=clock)
    bn_hold = (batchnorm.FrozenHold(model, list(model.trainable_weights))
               if cfg.bn_mode == batchnorm.FROZEN else None)
    compiled = CompiledSteps(model, optimizer, scheme, roles, dist=dist,
                             global_batch=cfg.batch_size, prefix_cache=cache, bn_hold=bn_hold,
                             trial=scheme.elastic and cfg.trial_check)
    if scheme.elastic and dist.on and not compiled.in_step:
        raise UserError(f"--strategy {cfg.strategy}: {cfg.train_type} with --optimizer "
                        f"{cfg.optimizer} needs importance probes of its own, which a "
                        f"distributed run does not take; use elastic_training (SGD or Adam)")
    time_model = table = table_path = None
    profiling_s = 0.0
    if scheme.elastic and dist.is_chief:
        time_model, table, table_path, profiling_s = _load_time_model(
            cfg, model, num_classes, log, in_child=profiles_in_child(cfg, given_model, dist.on),
            cache=cache, trace_dir=out, clock=clock,
            run_steps=calibration.first_profiling_steps(cfg.rho == AUTO, cfg.rho_feedback,
                                                        total_steps))
    restore_random_state(model, rng_state, cfg.seed)
    resume = _resumable(out, cfg, log)
    os.makedirs(out, exist_ok=True)
    return RunSetup(cfg=cfg, scheme=scheme, bundle=bundle, model=model, compiled=compiled,
                    roles=roles, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                    out=out, resume=resume, dist=dist, time_model=time_model, table=table,
                    table_path=table_path, prefix_cache=cache, bn_forced=bn_forced, bn_hold=bn_hold,
                    profiling_s=profiling_s)


def _why_uncached(cfg, scheme, dist):
    """Why --cache_frozen_prefix auto leaves a run uncached before looking at its model, in a
    few words; None when it looks on (or the setting is true or false)."""
    if cfg.cache_frozen_prefix != AUTO:
        return None
    if dist.on:
        return why_not_distributed(f"--strategy {cfg.strategy}")
    if scheme.trains_everything:
        return f"{cfg.train_type} trains every tensor, so no prefix is frozen"
    return None


def profiles_in_child(cfg, given_model, distributed):
    """Whether a run that has no timing table profiles in a child process (--profile_in)."""
    if given_model:  # a model object cannot be rebuilt from its name in a child process
        return False
    # a strategy's model is profiled in a child, on one device: its variables live under
    # the strategy's scope, which the profiler's steps do not enter
    return cfg.profile_in == "child" or distributed


def _load_time_model(cfg, model, num_classes, log, in_child=True, cache=None, trace_dir=None,
                     clock=time.perf_counter, run_steps=None):
    """(time model, table, its path, seconds spent profiling it first: 0 when it was read).
    run_steps: the run's steps under --rho auto with its closed loop on (a first profiling
    calibrates only when that pays for them: profiler/run.py's profile_model)."""
    path = cfg.timing_table or tables.default_table_path(
        cfg.model_name, cfg.input_size, cfg.batch_size, num_classes, cfg.optimizer)
    read = disk.table_to_read(path, trace_dir, cfg, log)  # a resumed run reads its own copy
    profiled, t0 = not os.path.exists(read), clock()
    table = load_or_profile(read, model, cfg.model_name, cfg.input_size, cfg.batch_size,
                            num_classes, seed=cfg.seed, progress=cfg.progress, log=log,
                            optimizer=cfg.optimizer, in_child=in_child, trace_dir=trace_dir,
                            run_steps=run_steps)
    profiling_s = clock() - t0 if profiled else 0.0
    if read == path:
        disk.keep_table(table, trace_dir)
    tm = TimeModel(table, cache=cache.for_time_model() if cache is not None else None)
    if not tm.calibrated and not table.get("calibration_skipped"):
        log(f"note: {path} has no calibration (profiled with --calibrate false or by an older "
            f"version); re-run profiler.py so that rho holds when backward ops overlap")
    if cfg.rho != AUTO and cfg.rho < tm.rho_floor:
        from elastictrainer.prefix.plan import no_cut_note
        raise UserError(f"--rho {cfg.rho:g} is below this model's forward floor: the forward pass "
                        f"alone is {tm.rho_floor:.3f} of a full training step ({path})"
                        f"{no_cut_note(model)}")
    uncached = tm.without_cache().rho_floor
    if cache is not None and cfg.rho != AUTO and cfg.rho < uncached:
        log(f"prefix cache: rho {cfg.rho:g} is below the forward floor without the cache "
            f"({uncached:.2f}): only cached selections fit it, and the steps that fill the "
            f"cache run at a step ratio above {uncached:.2f}")
    return tm, table, path, profiling_s


def _resumable(out, cfg, log):
    """True when `out` holds an unfinished run of these settings to continue (--resume true);
    a finished run, or other settings, are refused with one line."""
    if not os.path.exists(os.path.join(out, CHECKPOINT_DIR, "checkpoint")):
        return False
    if not cfg.resume:
        log(f"--resume false: starting {out} over (its checkpoints are replaced)")
        shutil.rmtree(os.path.join(out, CHECKPOINT_DIR), ignore_errors=True)
        for f in os.listdir(out):
            if f.startswith("events.out.tfevents"):
                os.remove(os.path.join(out, f))
        return False
    try:
        saved = runlog.read_config(out)
    except (OSError, ValueError):
        saved = disk.restore_config(out, log)
    if saved is None:
        raise UserError(f"cannot resume {out}: its {runlog.CONFIG_FILE} is missing or "
                        f"unreadable; pass --resume false to start it over")
    check_same_run(saved, cfg, out)
    if runlog.run_status(out) == "finished":
        raise UserError(f"{out} already holds a finished run; pass another --run_name, or "
                        f"--resume false to start it over")
    return True


def user_data(data, model, cfg):
    """A DatasetBundle around a user's (train, test) tf.data datasets of batches."""
    try:
        train, test = data
    except (TypeError, ValueError):
        raise UserError("data must be a (train, test) pair of tf.data datasets") from None
    for name, ds in (("train", train), ("test", test)):
        if not isinstance(ds, tf.data.Dataset):
            raise UserError(f"data's {name} set must be a tf.data.Dataset of (images, labels) "
                            f"batches, got {type(ds).__name__}")
    if model is None:
        raise UserError("data=(train, test) needs model= as well (its head gives the classes)")
    x, y = next(iter(train))
    batch_size = int(x.shape[0])
    # said here in one line, before a step's trace would say it in a traceback
    wants = tuple(model.input_shape[1:])
    if len(x.shape) != len(wants) + 1 or any(
            w is not None and int(w) != int(got) for w, got in zip(wants, x.shape[1:])):
        raise UserError(f"the train set's images are {tuple(int(d) for d in x.shape[1:])}, "
                        f"but {model.name} takes {wants}: resize them, or pass a model of "
                        f"that input")
    if len(y.shape) != 1:
        raise UserError(f"the train set's labels are {tuple(int(d) for d in y.shape)} a "
                        f"batch; they must be class indices, one per image (one-hot labels: "
                        f"take their argmax)")
    batches = int(train.cardinality())
    if batches < 0 and not cfg.steps_per_epoch:  # infinite or unknown length
        raise UserError("the train set's length is unknown: set steps_per_epoch in the Config")
    classes = int(model.output_shape[-1])
    return DatasetBundle(train=train, test=test, num_classes=classes,
                         num_train=max(batches, 0) * batch_size, num_test=0,
                         name="user data"), batch_size


def get_random_state(model):
    """The augmentation generators' states as lists (JSON), for a checkpoint."""
    return [value.tolist() for _, value in random_state(model)]


def set_random_state(model, values):
    for (var, _), value in zip(random_state(model), values):
        var.assign(np.asarray(value, dtype=tf.as_dtype(var.dtype).as_numpy_dtype))


def random_state(model):
    """The states of the random layers' generators (augmentation, dropout), which profiling
    inside the run would advance, with their values now."""
    return [(v, v.numpy()) for v in flavors.for_model(model).random_state_variables(model)]


def restore_random_state(model, saved, seed):
    """Give training the same random stream whether or not the run profiled first: the layers'
    generators back to where they were, and the global seeds (which op seeds of every traced
    step, dropout's among them, are counted from) reset at this same point in every run."""
    for var, value in saved:
        var.assign(value)
    flavors.set_random_seed(seed)
