"""ElasticTrainer inside `model.fit`, for Keras 3 and tf-keras models alike:

    from elastictrainer.fit.callback import ElasticCallback
    model.compile(optimizer="adam", loss=..., metrics=["accuracy"])
    model.fit(train, epochs=10, validation_data=test,
              callbacks=[ElasticCallback(rho=0.5, interval=1, logdir="logs/my_run")])

The callback trains only the tensors ElasticTrainer selects, with the optimizer the model was
compiled with.  On the first batch it profiles the model (timing_table.py: the table is cached
under profiles/, keyed by the model's tensors, the batch shape and the optimizer's kind), then
drives the same runtime as the command line (elastic/: importance from probe steps, the exact
selection under rho, the closed loop on rho, the overhead accounting) through the same hooks
(elastic.driver.ElasticDriver).  It does so by giving model.fit its own train function for the
run: each batch goes through the step the runtime asks for (a probe, a timed full step, or the
selection's compiled step), which is Keras' own train step (the compiled loss and metrics, the
"loss" log) with gradients taken for the selected tensors only.  The frozen prefix's
activations are cached as on the command line (prefix/, cache_frozen_prefix, auto by default):
a selection with a cut trains its suffix on stored rows, for the steps_per_epoch x batch size
examples an epoch draws (a dataset that brings more distinct images turns the cache off, with
a warning, and the fit goes on uncached).

The run directory (`logdir`) holds what a command-line run writes: config.json, summary.json
and TensorBoard events under the reference's tags; history and the epoch logs get
`elastic_measured_ratio` and `elastic_selected`.  With BackupAndRestore the runtime's state is
restored with the epoch it restarts from (elastic_state.json, persist.py), the prefix cache's
store with it (prefix/persist.py).
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import argparse
import dataclasses
import os
import time

import keras as _keras3
import tensorflow as tf

from elastictrainer import flavors
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import batchnorm, compat, optimizers
from elastictrainer.flavors import shared
from elastictrainer.errors import UserError
from elastictrainer.config import FIT_LOGDIR, Config, as_keywords, parse_auto_bool
from elastictrainer.elastic import ElasticRuntime
from elastictrainer.elastic.driver import ElasticDriver
from elastictrainer.elastic.pace import for_trainer
from elastictrainer.elastic.budget import AUTO, parse_rho
from elastictrainer.fit import steps as fit_steps
from elastictrainer.fit.steps import FitSteps
from elastictrainer.fit import persist, timing_table as fit_table
from elastictrainer.runs.recorder import Recorder, new_summary
from elastictrainer.profiler import calibration, table as tables
from elastictrainer.method.roles import tensor_roles
from elastictrainer.method.schemes import SCHEMES
from elastictrainer.method.time_model import TimeModel
from elastictrainer.prefix.plan import why_not_distributed

# what the callback adds to Keras' epoch logs (and so to history)
MEASURED_RATIO_LOG = "elastic_measured_ratio"
SELECTED_LOG = "elastic_selected"


class ElasticCallback(_keras3.callbacks.Callback):
    """ElasticTrainer in model.fit (module docstring).  Works with Keras 3 and tf-keras models
    (it is a Keras 3 callback that also answers tf-keras' batch-hook questions).

    rho: the requested step-time ratio (elastic step / full step), or "auto" (each selection
    what `rho_objective` asks for: "share", the cheapest keeping `rho_share` of the estimated
    loss drop, the default; "rate", the most estimated loss drop per second of step, which
    chose the head alone in the paper's regime; or "gain", the most estimated loss drop beyond
    what full training's rate would bring, faster than "share" on a target near the
    pretraining and the head alone in the paper's regime too: docs/usage.md); rho_tolerance:
    with a numeric rho, the cheapest selection within that share of eq. 3's best importance,
    when it saves as large a share of the step (0, the paper's eq. 3, by default); interval: epochs
    between re-selections; logdir: the run directory; train_type: an elastic scheme of schemes.py;
    probe_batches, rho_feedback, economy, trial_check, pace_check, head_warmup, dp_resolution, bn_mode,
    cache_frozen_prefix, cache_budget_mb, cache_views, cache_dtype, seed: as the command
    line's flags (these and
    their defaults are Config's fields; bn_mode "inference" holds the model's BatchNorm layers
    on their moving statistics from the fit's start to its end, and puts them back as the model
    calls them after, and "frozen" holds those below the deepest tensor each step trains;
    seed: which stored view of an image a cached step trains on);
    timing_table: a table to use instead of profiling (else one is looked up or profiled under
    `profiles`); log: where the runtime's lines go (print; None for silence);
    clock: seconds, for step timing."""

    # the command line's settings with its defaults (config/settings.py)
    def __init__(self, rho=Config.rho, rho_share=Config.rho_share,
                 rho_objective=Config.rho_objective, rho_tolerance=Config.rho_tolerance,
                 interval=Config.interval, logdir=FIT_LOGDIR,
                 train_type=Config.train_type, probe_batches=Config.probe_batches,
                 rho_feedback=Config.rho_feedback, economy=Config.economy,
                 trial_check=Config.trial_check, pace_check=Config.pace_check,
                 head_warmup=Config.head_warmup,
                 dp_resolution=Config.dp_resolution, timing_table=Config.timing_table,
                 bn_mode=Config.bn_mode, cache_frozen_prefix=Config.cache_frozen_prefix,
                 cache_budget_mb=Config.cache_budget_mb, cache_views=Config.cache_views,
                 cache_dtype=Config.cache_dtype, seed=Config.seed, profiles=tables.PROFILE_DIR,
                 log=print, clock=time.perf_counter):
        super().__init__()
        if not SCHEMES.get_or_fail(train_type).elastic:
            raise UserError(f"ElasticCallback trains an elastic scheme; {train_type} is a fixed "
                            f"one")
        logdir = os.path.normpath(os.fspath(logdir))
        try:  # Config's errors name its flags; here they are keyword arguments
            self.cfg = Config(
                train_type=train_type, rho=_rho(rho),
                rho_share=_number(float, "rho_share", rho_share), rho_objective=rho_objective,
                rho_tolerance=_number(float, "rho_tolerance", rho_tolerance),
                interval=_number(float, "interval", interval),
                probe_batches=_number(int, "probe_batches", probe_batches),
                rho_feedback=bool(rho_feedback), economy=bool(economy),
                trial_check=bool(trial_check), pace_check=bool(pace_check),
                head_warmup=head_warmup, dp_resolution=_number(int, "dp_resolution", dp_resolution),
                logdir=os.path.dirname(logdir) or ".", run_name=os.path.basename(logdir),
                timing_table=timing_table, bn_mode=bn_mode,
                cache_frozen_prefix=_setting(cache_frozen_prefix),
                cache_budget_mb=_number(float, "cache_budget_mb", cache_budget_mb),
                cache_views=cache_views, cache_dtype=cache_dtype, seed=_number(int, "seed", seed),
                dataset_name="model.fit")
            self.cfg.validate()
        except UserError as error:
            raise UserError(as_keywords(str(error))) from None
        self.out = logdir
        self.profiles = profiles
        self.log = log or (lambda msg: None)
        self.clock = clock
        # a tf-keras model's fit asks its callbacks which batch hooks they implement
        compat.answer_tf_keras_batch_hooks(self, train=True)

    def set_model(self, model):
        """Keras hands every callback the model before fit starts any of them: the optimizer
        is built for every trainable tensor here (with the per-tensor Adam step counts,
        train_steps.py), so that BackupAndRestore, wherever it stands in the list, restores into
        the optimizer as it will train."""
        super().set_model(model)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and model.built and model.trainable_weights:
            optimizers.prepare_optimizer(optimizer, model.trainable_weights)

    # ------------------------------------------------------------------ the run
    def on_train_begin(self, logs=None):
        persist.refuse_finished(self.out)  # before the model's train function is replaced
        model = self.model
        self.flavor = flavors.for_model(model)
        if getattr(model, "optimizer", None) is None:
            raise UserError("ElasticCallback needs a compiled model (model.compile(optimizer, "
                            "loss, ...))")
        strategy = getattr(model, "distribute_strategy", None)
        self.strategy = strategy if strategy is not None and (
            strategy.num_replicas_in_sync > 1
            or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)) else None
        if (self.strategy is not None and self.flavor.NAME == "keras3"
                and shared.release(_keras3) < (3, 15)):
            # Keras 3.3 (TensorFlow 2.16's) fails to run the probe step's graph under a
            # tf.distribute strategy (a placeholder in a cond left unfed); 3.15 runs it
            raise UserError(f"ElasticCallback under a tf.distribute strategy needs Keras 3.15 "
                            f"or later for a Keras 3 model (this is {_keras3.__version__}); "
                            "train on one device, or use main.py --strategy")
        if model.built and model.trainable_weights:  # refused before profiling, not after
            fit_steps.covered_terms(SCHEMES[self.cfg.train_type].importance, model.optimizer,
                                    list(model.trainable_weights))
        if self.flavor.steps_per_execution(model) != 1:
            raise UserError("ElasticCallback times and selects every step: compile with "
                            "steps_per_execution=1")
        steps = self.params.get("steps")
        if not steps:
            raise UserError("ElasticCallback needs the epoch's length: pass steps_per_epoch to "
                            "model.fit (the dataset's length is unknown)")
        self.steps_per_epoch, self.epochs = int(steps), int(self.params["epochs"])
        self.driver, self._restore_state, self.cache = None, None, None
        self._bn_hold = None
        self._global_step, self._train_time, self._epoch_start = 0, 0.0, None
        self._last_batch_end = None
        # before the first batch traces (or profiles) a step with the model
        self._bn_forced = batchnorm.apply(model, self.cfg.bn_mode)
        said = batchnorm.describe(model, self.cfg.bn_mode)
        if said:
            self.log(said)
        self.keras_train_functions = compat.replace_train_function(model, self._train_function)

    def _train_function(self, iterator):
        data = next(iterator)
        if self.driver is None:
            self._setup(data)
        g = self._global_step
        with self.writer.as_default():
            step = self.driver.before_step(g)
            t0 = self.clock()
            outputs = step(*fit_steps.parts(data))
            train_steps.first_output(outputs).numpy()
            self.driver.after_step(g, self.clock() - t0, outputs)
        self._global_step += 1
        return outputs[1]

    def _setup(self, data):
        """On the first batch: the timing table (profiled on this batch if absent), the
        runtime, the run directory."""
        model, flavor, cfg = self.model, self.flavor, self.cfg
        optimizer = model.optimizer
        data = self._local(data)  # under a strategy, the replicas' shares together
        batch_size, input_size, num_classes = fit_table.batch_shape(flavor, model, data)
        opt_name = type(optimizer).__name__.lower()
        path = cfg.timing_table or fit_table.default_path(
            model, input_size, batch_size, num_classes, opt_name, self.profiles)
        run_steps = calibration.first_profiling_steps(cfg.rho == AUTO, cfg.rho_feedback,
                                                      self.steps_per_epoch * self.epochs)
        profiling_s = fit_table.ensure(path, model, flavor, data, input_size, batch_size,
                                       num_classes, run_steps, self.log, self.clock)
        table = tables.load_table(path, batch_size=batch_size, optimizer=opt_name)
        # the run's settings as model.fit resolves them, saved as config.json
        self.cfg = cfg = dataclasses.replace(
            cfg, model_name=model.name, input_size=input_size, batch_size=batch_size,
            num_classes=num_classes, optimizer=opt_name,
            learning_rate=float(tf.convert_to_tensor(optimizer.learning_rate)),
            num_epochs=self.epochs, steps_per_epoch=self.steps_per_epoch, timing_table=path)
        self.cache = self._plan_cache()
        time_model = TimeModel(table, cache=None if self.cache is None
                               else self.cache.for_time_model())
        if cfg.rho != AUTO and cfg.rho < time_model.rho_floor:
            from elastictrainer.prefix.plan import no_cut_note
            raise UserError(f"rho {cfg.rho:g} is below this model's forward floor: the forward "
                            f"pass alone is {time_model.rho_floor:.3f} of a full training step "
                            f"({path}){no_cut_note(model)}")
        optimizers.prepare_optimizer(optimizer, model.trainable_weights)
        scheme = SCHEMES[cfg.train_type]
        self._bn_hold = (batchnorm.FrozenHold(model, list(model.trainable_weights))
                         if cfg.bn_mode == batchnorm.FROZEN else None)
        self.trainer = FitSteps(model, optimizer, scheme.importance, self.strategy,
                                prefix_cache=self.cache, bn_hold=self._bn_hold,
                                trial=cfg.trial_check)
        compiled = self.trainer.steps
        pace = for_trainer(self.trainer, cfg.pace_check, self.log)
        total = self.steps_per_epoch * self.epochs
        runtime = ElasticRuntime(
            time_model, cfg.rho, share=cfg.rho_share, objective=cfg.rho_objective,
            tolerance=cfg.rho_tolerance, feedback=cfg.rho_feedback,
            steps_per_epoch=self.steps_per_epoch, total_steps=total, interval=cfg.interval,
            probe_batches=cfg.probe_batches,
            dp_resolution=cfg.dp_resolution, compile_ms=table.get("compile_ms"),
            economy=cfg.economy, economy_off_words="economy=False",
            is_compiled=lambda selection: selection in compiled, profiling_s=profiling_s,
            profiled_in_clock=True, clock=self.clock, log=self.log,
            head_warmup=cfg.head_warmup,
            trial=None if self.trainer.trial is None else self.trainer.trial.drops,
            pace=None if pace is None else pace.compare,
            head=[k for k, role in enumerate(tensor_roles(model)) if role == "head"])
        self.driver = ElasticDriver(self.trainer, scheme, runtime, pace=pace)
        summary = new_summary(
            cfg, elastic=True, tensor_names=[flavors.tensor_name(v) for v in self.trainer.variables],
            timing_table=path, steps_per_epoch=self.steps_per_epoch,
            energy_source="not measured in model.fit")
        self.rec = Recorder(self.out, cfg, summary, where=" in model.fit", log=self.log)
        self.rec.begin()
        self.writer = self.rec.writer
        self.rec.plan(self.driver.on_train_begin())
        if self._restore_state is not None:
            self._load(self._restore_state)
        elif self.cache is not None:
            self.cache.clear()
        self._save_summary()

    def _plan_cache(self):
        """The run's prefix.cache.PrefixCache, or None (said in one line, as on the command
        line): under a strategy, with cache_frozen_prefix false, or without a usable cut."""
        cfg = self.cfg
        if self.strategy is not None:
            if cfg.cache_frozen_prefix is True:
                raise UserError("cache_frozen_prefix=True trains on one device; it does not "
                                "combine with the model's tf.distribute strategy")
            if cfg.cache_frozen_prefix:
                self.log("prefix cache off (cache_frozen_prefix auto): "
                         + why_not_distributed("the model's tf.distribute strategy"))
            return None
        if not cfg.cache_frozen_prefix:
            return None
        from elastictrainer.prefix.plan import plan

        return plan(self.model, list(self.model.trainable_weights), cfg,
                    self.steps_per_epoch * cfg.batch_size, self.out, self.log, clock=self.clock)

    def _local(self, data):
        """This process's part of a batch as plain tensors: the local replicas' shares
        together (the whole batch on one machine)."""
        if self.strategy is None:
            return data
        return tf.nest.map_structure(
            lambda v: tf.concat(self.strategy.experimental_local_results(v), 0), data)

    # ------------------------------------------------------------------ epochs
    def on_epoch_begin(self, epoch, logs=None):
        if self._epoch_start is None:  # the first epoch of this fit: a restart resumes
            self._restore_state = persist.saved_state(self.out, epoch)
            if self._restore_state is not None and self.driver is not None:
                self._load(self._restore_state)
            if self._restore_state is None:
                self._global_step = epoch * self.steps_per_epoch
            if epoch == 0:  # a new run, not on top of an unfinished one's files
                persist.start_over(self.out, self.log)
        self._epoch_start = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch_end = self.clock()

    def on_epoch_end(self, epoch, logs=None):
        if self.driver is None:
            return
        logs = logs if logs is not None else {}
        self._train_time += (self._last_batch_end or self.clock()) - self._epoch_start
        rt = self.driver.rt
        with self.writer.as_default():
            self.driver.on_epoch_end(epoch + 1, self._global_step)
        self.rec.elastic(rt.records, rt.corrections)
        self._cache_summary()
        self.rec.epoch(persist.epoch_record(epoch + 1, self._train_time, logs, rt),
                       self._global_step, train_scalars=True)
        self.rec.flush()
        persist.save_state(self.out, epoch + 1, self._global_step, self._train_time, rt,
                           self.rec.summary, self.cache)
        measured = rt.measured_so_far()
        logs[MEASURED_RATIO_LOG] = float("nan") if measured is None else measured
        logs[SELECTED_LOG] = len(rt.selection or ())

    def on_train_end(self, logs=None):
        compat.restore_train_function(self.model, self.keras_train_functions)
        batchnorm.restore(self._bn_forced)
        if self._bn_hold is not None:
            self._bn_hold.release()
        if self.driver is None:
            return
        with self.writer.as_default():
            result = self.driver.on_train_end(self._train_time, self._global_step)
        rt = self.driver.rt
        self.rec.elastic(rt.records, rt.corrections)
        self._cache_summary()
        if self.cache is not None:
            self.cache.close()
        self.rec.set(step_cache_traces=self.trainer.steps.traces)
        self.rec.finish(stopped=False, train_time_s=self._train_time, step=self._global_step,
                        result=result)

    # ------------------------------------------------------------------ state
    def _cache_summary(self):
        if self.cache is not None:
            self.rec.set(prefix_cache=self.cache.summary(self._global_step))

    def _save_summary(self):
        rt = self.driver.rt
        self.rec.elastic(rt.records, rt.corrections)
        self.rec.save()

    def _load(self, state):
        self.driver.rt.load_state(state["runtime"])
        self._global_step = int(state["global_step"])
        self._train_time = float(state["train_time_s"])
        self.rec.resume(state["summary"])
        if self.cache is not None and state.get("prefix_cache") is not None:
            self.cache.load_state(state["prefix_cache"])
        self.log(f"ElasticCallback: resuming the elastic runtime at epoch {state['epoch']} "
                 f"(step {self._global_step})")


def _rho(value):
    """rho as ElasticCallback takes it: a number, or "auto"; anything else in one line."""
    try:
        return parse_rho(value)
    except (TypeError, ValueError):
        raise UserError(f"rho must be a number in (0, 1] or \"auto\", got {value!r}") from None


def _number(kind, name, value):
    """A numeric argument as `kind` (float or int); anything that is not one in one line."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be {'a number' if kind is float else 'an integer'}, got "
                        f"{value!r}") from None


def _setting(value):
    """cache_frozen_prefix as ElasticCallback takes it: the command line's spellings, or a
    bool; anything else in one line."""
    try:
        return parse_auto_bool(value)
    except argparse.ArgumentTypeError:
        raise UserError(f"cache_frozen_prefix must be auto, true or false, got {value!r}") \
            from None
