"""The training loop (paper Sec. 3): one loop for every --train_type.

A scheme (schemes.py) only decides *which tensors train*, and for the elastic schemes re-decides
it every --interval epochs: importance (importance.py, eq. 4-6) on fresh probe batches, then the
exact selection under rho (time_model.py, selector.py, eq. 3).  Metrics, logging, evaluation and
timing are written once, here.
"""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import contextlib
import dataclasses
import math
import os
import signal
import statistics
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

from elastictrainer import energy, engine, runlog
from elastictrainer.checkpoint import CHECKPOINT_DIR, RunCheckpoint, check_same_run
from elastictrainer.common import RunError, UserError, check_writable_dir, one_line, peak_rss_mb
from elastictrainer.data.loaders import first_undecodable, load_dataset
from elastictrainer.importance import IMPORTANCE, normalize
from elastictrainer.models.build import build_sized
from elastictrainer.profiler import table as tables
from elastictrainer.profiler.run import load_or_profile
from elastictrainer.rho_control import (FULL_STEPS, MEASURE_STEPS, RECHECK_STEPS, RhoController,
                                        prefer_measured)
from elastictrainer.roles import check_roles, tensor_roles
from elastictrainer.schemes import SCHEMES
from elastictrainer.time_model import TimeModel
from elastictrainer.trainer import Trainer

_clock = time.perf_counter  # step timing (tests inject a fake clock)


class _StopFlag:
    """Ctrl-C asks the loop to stop after the current step instead of killing it mid-write."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C stops at once
                raise KeyboardInterrupt
            self.requested = True
        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def _load_time_model(cfg, model, num_classes, log, in_child=True):
    path = cfg.timing_table or tables.default_table_path(
        cfg.model_name, cfg.input_size, cfg.batch_size, num_classes, cfg.optimizer)
    table = load_or_profile(path, model, cfg.model_name, cfg.input_size, cfg.batch_size,
                            num_classes, seed=cfg.seed, progress=cfg.progress, log=log,
                            optimizer=cfg.optimizer, in_child=in_child)
    tm = TimeModel(table)
    if not tm.calibrated:
        log(f"note: {path} has no calibration (profiled with --calibrate false or by an older "
            f"version); re-run profiler.py so that rho holds when backward ops overlap")
    if cfg.rho < tm.rho_floor:
        raise UserError(f"--rho {cfg.rho:g} is below this model's forward floor: the forward pass "
                        f"alone is {tm.rho_floor:.3f} of a full training step ({path})")
    return tm, path


def run(cfg, log=print, model=None, data=None):
    """Train as `cfg` says; returns the summary dict (also written to summary.json).

    For one's own model and data in Python (the README's example):
      model: a tf_keras Model to train instead of building cfg.model_name; it keeps its head,
        its input size and its name, which names its timing table and run.
      data: (train, test) tf.data datasets of (images, integer labels) batches, instead of
        loading cfg.dataset_name; the train set should reshuffle each iteration.  An epoch is
        the train set once (or cfg.steps_per_epoch steps).
    """
    from tqdm import tqdm

    cfg.validate()
    check_writable_dir(cfg.logdir, "--logdir")  # before minutes of loading and profiling
    scheme = SCHEMES[cfg.train_type]
    keras.utils.set_random_seed(cfg.seed)
    if data is not None:
        bundle, batch_size = _user_data(data, model, cfg)
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
    given_model = model is not None
    if given_model:
        if not isinstance(model, keras.Model):
            raise UserError(f"model must be a tf_keras Model (import tf_keras as keras), got "
                            f"{type(model).__module__}.{type(model).__name__}")
        input_size, num_classes = int(model.input_shape[1]), int(model.output_shape[-1])
        cfg = dataclasses.replace(cfg, model_name=model.name, input_size=input_size,
                                  weights="(model object)")
    else:
        # a saved model with another class count gets a new head (models/build.py)
        model, input_size, num_classes = build_sized(cfg.model_name, cfg.input_size,
                                                     num_classes, cfg.weights, log=log,
                                                     progress=cfg.progress)
    if input_size != cfg.input_size:
        raise UserError(f"{cfg.model_name} takes {input_size}x{input_size} images; "
                        f"pass --input_size {input_size}")
    if num_classes < bundle.num_classes:
        raise UserError(f"{cfg.model_name} outputs {num_classes} classes but "
                        f"{cfg.dataset_name} has {bundle.num_classes}")
    cfg = dataclasses.replace(cfg, num_classes=num_classes, run_name=cfg.resolved_run_name())

    steps_per_epoch = math.ceil(bundle.num_train / cfg.batch_size) if bundle.num_train else None
    if cfg.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch or cfg.steps_per_epoch, cfg.steps_per_epoch)
    total_steps = steps_per_epoch * cfg.num_epochs
    rng_state = _random_state(model)
    roles = check_roles(tensor_roles(model))
    optimizer = engine.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
                                      total_steps, schedule=cfg.lr_schedule)
    trainer = Trainer(model, optimizer, scheme, roles)
    n = len(trainer.variables)
    time_model = table_path = None
    if scheme.elastic:
        # a model object cannot be rebuilt from its name in a child process
        time_model, table_path = _load_time_model(cfg, model, num_classes, log,
                                                  in_child=not given_model)
    _restore_random_state(model, rng_state, cfg.seed)

    out = runlog.run_dir(cfg.logdir, cfg.run_name)
    resume_from = _resumable(out, cfg, log)
    os.makedirs(out, exist_ok=True)
    train_iter = iter(bundle.train.repeat())
    probe_iter = iter(bundle.train.repeat())
    ckpt = RunCheckpoint(out, model, optimizer, {"train_data": train_iter,
                                                 "probe_data": probe_iter})
    if not resume_from:
        runlog.write_json(os.path.join(out, runlog.CONFIG_FILE), dataclasses.asdict(cfg))
    summary = {
        "train_type": cfg.train_type, "model": cfg.model_name, "dataset": cfg.dataset_name,
        "rho": cfg.rho if scheme.elastic else None, "seed": cfg.seed, "num_tensors": n,
        "tensor_names": [v.name for v in trainer.variables], "timing_table": table_path,
        "steps_per_epoch": steps_per_epoch, "status": "running",
        "best_test_accuracy": None, "train_time_s": 0.0, "epochs": [], "selections": [],
    }
    if bundle.skipped:
        shown = ", ".join(bundle.skipped[:3]) + (", ..." if len(bundle.skipped) > 3 else "")
        log(f"warning: skipped {len(bundle.skipped)} file(s) of {cfg.dataset_name} that are not "
            f"JPEG/PNG/GIF/BMP images: {shown}")
    summary.update(skipped_images=len(bundle.skipped), skipped_files=list(bundle.skipped[:100]))
    # Energy over training time only (not evaluation), like train_time_s.
    meter = energy.detect(mode=cfg.energy)
    summary.update(energy_j=None, avg_power_w=None, energy_source=meter.source)

    def save_summary():
        runlog.write_json(os.path.join(out, runlog.SUMMARY_FILE), summary)

    st = _LoopState(selection=scheme.fixed_selection(roles) if not scheme.elastic else None)
    elastic = None
    if scheme.elastic:
        elastic = _Elastic(trainer, scheme, RhoController(time_model, cfg.rho, cfg.rho_feedback),
                           cfg, probe_iter, steps_per_epoch, summary, log)
    if resume_from:
        saved = ckpt.restore()
        st = _LoopState(**saved["loop"])
        summary.clear()
        summary.update(saved["summary"], status="running")
        summary.pop("error", None)
        _set_random_state(model, saved["random"])
        meter.restore(*saved["energy"])
        if elastic:
            elastic.load_state(saved["elastic"])
        # events written after this checkpoint would repeat their steps: dropped
        runlog.truncate_events(out, saved["wall_time"])
        log(f"resuming {out} from {os.path.basename(ckpt.latest)}: epoch {st.epoch + 1} of "
            f"{cfg.num_epochs}, step {st.step_in_epoch} of {steps_per_epoch}, "
            f"{st.train_time:.1f} s trained")
    writer = tf.summary.create_file_writer(out)
    reselect_every = cfg.interval * steps_per_epoch

    def checkpoint():
        state = {"loop": dataclasses.asdict(st), "summary": summary,
                 "random": _get_random_state(model), "energy": [meter.joules, meter.active_s],
                 "elastic": elastic.state() if elastic else None, "wall_time": time.time()}
        writer.flush()
        ckpt.save(state, st.global_step)
        st.last_checkpoint = _clock()

    save_summary()
    st.last_checkpoint = _clock()
    every_s = cfg.checkpoint_minutes * 60
    with (_StopFlag() as stop, writer.as_default(), meter,
          _outcome_recorded(summary, save_summary, bundle.files)):
        while st.epoch < cfg.num_epochs:
            epoch = st.epoch + 1
            meter.resume()
            bar = tqdm(total=steps_per_epoch, initial=st.step_in_epoch,
                       desc=f"epoch {epoch}/{cfg.num_epochs}", disable=not cfg.progress,
                       unit="step", leave=False)
            t_epoch = _clock()
            while st.step_in_epoch < steps_per_epoch:
                x, y = next(train_iter)
                if elastic and st.global_step >= st.next_reselect:
                    st.selection = elastic.reselect(st.global_step)
                    st.next_reselect = max(st.next_reselect + reselect_every, st.global_step + 1)
                if elastic:
                    elastic.before_step(x, y)
                t_step = _clock()
                loss, logits = trainer.step_for(st.selection)(x, y)
                loss = float(loss)
                if elastic and elastic.after_step(_clock() - t_step, st.global_step):
                    st.selection = elastic.selection
                if not math.isfinite(loss):
                    summary["status"] = "nan"
                    meter.pause()
                    summary.update(train_time_s=st.train_time + _clock() - t_epoch,
                                   energy_j=meter.joules, avg_power_w=meter.avg_power_w)
                    save_summary()
                    raise RunError(f"the loss became {loss} at epoch {epoch}, step "
                                   f"{st.global_step}; try a lower --learning_rate")
                st.add(loss, logits.numpy(), y.numpy())
                if st.global_step % runlog.SCALAR_EVERY_STEPS == 0:
                    _write_train_scalars(trainer, st.run_correct, st.run_loss, st.run_seen,
                                         st.global_step)
                    st.run_loss = st.run_correct = st.run_seen = 0.0
                # refresh=False: the bar redraws at tqdm's own pace, not once per step (every
                # millisecond of the loop's own work is paid at any rho)
                bar.set_postfix(loss=f"{st.ep_loss / st.ep_seen:.3f}",
                                acc=f"{100 * st.ep_correct / st.ep_seen:.1f}", refresh=False)
                bar.update(1)
                if stop.requested or (every_s and _clock() - st.last_checkpoint >= every_s
                                      and st.step_in_epoch < steps_per_epoch):
                    st.train_time += _clock() - t_epoch
                    checkpoint()  # mid-epoch: a kill or Ctrl-C loses at most a few minutes
                    t_epoch = _clock()  # saving is not training
                    if stop.requested:
                        break
            st.train_time += _clock() - t_epoch
            meter.pause()
            summary.update(energy_j=meter.joules, avg_power_w=meter.avg_power_w)
            bar.close()
            # An epoch whose every step ran is evaluated even if Ctrl-C came during its last
            # (possibly partial) batch.
            if stop.requested and st.step_in_epoch < steps_per_epoch:
                summary["train_time_s"] = st.train_time
                break
            if st.run_seen:
                _write_train_scalars(trainer, st.run_correct, st.run_loss, st.run_seen,
                                     st.global_step)
                st.run_loss = st.run_correct = st.run_seen = 0.0
            test_acc, test_loss = trainer.evaluate(bundle.test)
            tf.summary.scalar(runlog.TEST_ACCURACY, test_acc, step=st.global_step)
            tf.summary.scalar(runlog.TEST_LOSS, test_loss, step=st.global_step)
            if meter.joules is not None:
                tf.summary.scalar(runlog.ENERGY_JOULES, meter.joules, step=st.global_step)
            if test_acc > st.best:
                st.best = test_acc
                if cfg.save_model:
                    _save_weights_atomically(model, os.path.join(out, runlog.BEST_WEIGHTS_FILE))
            summary["epochs"].append({
                "epoch": epoch, "train_time_s": st.train_time, "test_accuracy": test_acc,
                "test_loss": test_loss, "train_accuracy": 100 * st.ep_correct / max(st.ep_seen, 1),
                "train_loss": st.ep_loss / max(st.ep_seen, 1), "selected": len(st.selection),
                "energy_j": meter.joules,
            })
            summary["best_test_accuracy"] = st.best
            summary["train_time_s"] = st.train_time
            log(f"epoch {epoch}: train loss {st.ep_loss / max(st.ep_seen, 1):.4f}, "
                f"test accuracy {test_acc:.2f}%, test loss {test_loss:.4f}, "
                f"training time {st.train_time:.1f} s, {len(st.selection)}/{n} tensors trained")
            st.next_epoch()
            checkpoint()
            save_summary()
            if stop.requested:
                break
        if elastic:
            elastic.finish(st.train_time, st.global_step)
    writer.flush()
    summary["status"] = "interrupted" if stop.requested else "finished"
    summary["step_cache_traces"] = trainer.steps.traces
    summary["peak_rss_mb"] = peak_rss_mb()
    save_summary()
    train_time, best = st.train_time, st.best
    hours = train_time / 3600
    if cfg.save_txt:
        np.savetxt(os.path.join(out, f"{cfg.run_name}.txt"), [hours, max(best, 0.0)])
    spent = (f", energy {meter.joules:.0f} J ({meter.source})" if meter.joules is not None
             else "")
    if elastic:
        measured = summary["measured_ratio"]
        wall = summary["wall_ratio"]
        spent += (f"; step-time ratio asked {cfg.rho:g}, measured "
                  f"{'n/a' if measured is None else f'{measured:.3f}'}"
                  f" ({len(summary['corrections'])} correction(s)); wall clock "
                  f"{'n/a' if wall is None else f'{wall:.2f}'} of full training's, estimated "
                  f"in the run (re-selecting {summary['reselection_overhead_s']:.1f} s)")
    ended = (f"interrupted after {len(summary['epochs'])} of {cfg.num_epochs} epochs (run the "
             f"same command again to continue)" if stop.requested else "finished")
    log(f"{cfg.train_type} {ended}: best test accuracy {max(best, 0.0):.2f}%, "
        f"training time {hours:.4f} h ({train_time:.1f} s){spent}; results in {out}")
    return summary


@dataclasses.dataclass
class _LoopState:
    """Where the loop is: what a checkpoint needs besides weights, optimizer and iterators."""
    selection: tuple = None
    epoch: int = 0  # epochs finished
    step_in_epoch: int = 0
    global_step: int = 0
    next_reselect: float = 0
    train_time: float = 0.0
    best: float = -1.0
    ep_loss: float = 0.0
    ep_correct: float = 0.0
    ep_seen: float = 0.0
    run_loss: float = 0.0
    run_correct: float = 0.0
    run_seen: float = 0.0
    last_checkpoint: float = 0.0

    def __post_init__(self):
        if self.selection is not None:
            self.selection = tuple(int(k) for k in self.selection)

    def add(self, loss, logits, labels):
        b = int(labels.shape[0])
        correct = float(np.sum(np.argmax(logits, -1) == labels))
        self.ep_loss += loss * b
        self.ep_correct += correct
        self.ep_seen += b
        self.run_loss += loss * b
        self.run_correct += correct
        self.run_seen += b
        self.global_step += 1
        self.step_in_epoch += 1

    def next_epoch(self):
        self.epoch += 1
        self.step_in_epoch = 0
        self.ep_loss = self.ep_correct = self.ep_seen = 0.0


def _resumable(out, cfg, log):
    """True when `out` holds an unfinished run of these settings to continue (--resume true);
    a finished run, or other settings, are refused with one line."""
    config_path = os.path.join(out, runlog.CONFIG_FILE)
    if not os.path.exists(os.path.join(out, CHECKPOINT_DIR, "checkpoint")):
        return False
    if not cfg.resume:
        log(f"--resume false: starting {out} over (its checkpoints are replaced)")
        import shutil
        shutil.rmtree(os.path.join(out, CHECKPOINT_DIR), ignore_errors=True)
        for f in os.listdir(out):
            if f.startswith("events.out.tfevents"):
                os.remove(os.path.join(out, f))
        return False
    try:
        saved = runlog.read_config(out)
    except (OSError, ValueError):
        raise UserError(f"cannot resume {out}: its {runlog.CONFIG_FILE} is missing or "
                        f"unreadable; pass --resume false to start it over") from None
    check_same_run(saved, cfg, out)
    try:
        status = runlog.read_summary(out).get("status")
    except (OSError, ValueError):
        status = None
    if status == "finished":
        raise UserError(f"{out} already holds a finished run; pass another --run_name, or "
                        f"--resume false to start it over")
    return True


def _save_weights_atomically(model, path):
    # the format follows the name's ending (".weights.h5"), so the temporary name keeps it
    head, base = os.path.split(path)
    tmp = os.path.join(head, "tmp-" + base)
    model.save_weights(tmp)
    os.replace(tmp, path)


def _user_data(data, model, cfg):
    """A DatasetBundle around a user's (train, test) tf.data datasets of batches."""
    from elastictrainer.data.loaders import DatasetBundle

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
    x, _ = next(iter(train))
    batch_size = int(x.shape[0])
    batches = int(train.cardinality())
    if batches < 0 and not cfg.steps_per_epoch:  # infinite or unknown length
        raise UserError("the train set's length is unknown: set steps_per_epoch in the Config")
    classes = int(model.output_shape[-1])
    return DatasetBundle(train=train, test=test, num_classes=classes,
                         num_train=max(batches, 0) * batch_size, num_test=0,
                         name="user data"), batch_size


def _get_random_state(model):
    """The augmentation generators' states as lists (JSON), for a checkpoint."""
    return [value.tolist() for _, value in _random_state(model)]


def _set_random_state(model, values):
    for (var, _), value in zip(_random_state(model), values):
        var.assign(np.asarray(value, dtype=var.dtype.as_numpy_dtype))


def _random_state(model):
    """The states of the random layers' generators (augmentation), which profiling inside the
    run would advance.  Private tf_keras attributes (`_random_generator._generator`)."""
    gens = [getattr(getattr(layer, "_random_generator", None), "_generator", None)
            for layer in model.submodules]
    return [(g.state, g.state.numpy()) for g in gens if g is not None]


def _restore_random_state(model, saved, seed):
    """Give training the same random stream whether or not the run profiled first: the layers'
    generators back to where they were, and the global seeds (which op seeds of every traced
    step, dropout's among them, are counted from) reset at this same point in every run."""
    for var, value in saved:
        var.assign(value)
    keras.utils.set_random_seed(seed)


@contextlib.contextmanager
def _outcome_recorded(summary, save_summary, files=()):
    """A run that dies says so in summary.json (status failed and the error, the finished
    epochs kept); TensorFlow's own errors become one line, naming the file that does not decode
    when one of the dataset's `files` is to blame."""
    try:
        yield
    except BaseException as e:
        if summary["status"] == "running":
            summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        message = one_line(e)
        if isinstance(e, tf.errors.OpError):
            bad, why = first_undecodable(files) if files else (None, None)
            message = (f"cannot decode {bad} ({why}); remove or re-save it" if bad else
                       one_line(e.message.split("}}")[-1], 300))
        summary["error"] = message
        summary["peak_rss_mb"] = peak_rss_mb()
        save_summary()
        if isinstance(e, tf.errors.OpError):
            raise RunError(f"the run stopped in epoch {len(summary['epochs']) + 1}: {message}; "
                           f"the finished epochs are in summary.json") from e
        raise


def _write_train_scalars(trainer, correct, loss_sum, seen, step):
    tf.summary.scalar(runlog.TRAIN_ACCURACY, 100.0 * correct / seen, step=step)
    tf.summary.scalar(runlog.TRAIN_LOSS, loss_sum / seen, step=step)
    lr = trainer.optimizer.learning_rate
    lr = lr(trainer.optimizer.iterations) if callable(lr) else lr
    tf.summary.scalar(runlog.LEARNING_RATE, float(lr), step=step)


class _Elastic:
    """The elastic schemes' side of the loop: re-selection every --interval epochs (importance
    on fresh probe batches, eq. 4-6; the exact selection under rho, eq. 3) and the closed loop
    on rho (rho_control.py): full steps timed at each re-selection, the selection's own steps
    timed as it trains, and a re-solve when it misses rho (with --rho_feedback true)."""

    def __init__(self, trainer, scheme, controller, cfg, probe_iter, steps_per_epoch, summary,
                 log):
        self.trainer, self.scheme, self.ctl, self.cfg = trainer, scheme, controller, cfg
        self.probe_iter, self.steps_per_epoch = probe_iter, steps_per_epoch
        self.summary, self.log = summary, log
        self.selection = None
        self.record = None  # summary record of the selection training now
        self.importance = None
        self.full_ms = None
        self.full_times = []
        self.warm = set()  # ids of full steps already called once (a first call compiles)
        self.times = []  # this selection's step times (s), its first step apart
        self.first_step_s = None
        self.corrections_here, self.was_over = 0, False
        self.rounds = 1  # measurement rounds this window is judged on (2: confirming a miss)
        # A measurement window: the selection's steps from times[win_t] and the full steps from
        # full_times[win_f].  The first opens with the selection; once judged, the next opens
        # RECHECK_STEPS steps later (measuring False meanwhile: no full steps are timed).
        self.win_t = self.win_f = 0
        self.measuring = True
        # the ratio each selection's latest measurement window gave (rho_control.prefer_measured)
        self.measured = {}
        self.overhead_s = 0.0
        # its parts: importance probes, full steps timed, compiling new selections' steps, solving
        self.overhead_parts = dict.fromkeys(OVERHEAD_PARTS, 0.0)
        self.step_s = 0.0  # the closed selections' own steps, compiling excepted
        self.full_s = 0.0  # what full training would have spent on the same steps (_close_record)
        # the current selection's own steps by measurement window: [seconds (compiling
        # excepted once closed), the window's ratio (None until judged)] per window, each
        # holding the steps until the next window opens
        self.segments = [[0.0, None]]
        self.first_seg = 0  # the segment that holds the step booked as a first (compiling) one
        self.compile_counted = False  # full_s holds one step's compiling, as a full run pays
        summary.update(rho_feedback=controller.feedback, measured_ratio=None, corrections=[],
                       reselection_overhead_s=0.0, wall_ratio=None)

    # ------------------------------------------------------------------ re-selection
    def reselect(self, global_step):
        """Evaluate importance on fresh probe batches, time full steps, solve eq. 3."""
        cfg = self.cfg
        self._close_record()
        t0 = _clock()
        batches = [next(self.probe_iter) for _ in range(cfg.probe_batches)]
        self.importance = normalize(IMPORTANCE[self.scheme.importance](self.trainer, batches))
        t1 = _clock()
        self.corrections_here, self.was_over = 0, False
        self._solve(global_step, reason="interval", importance_ms=(t1 - t0) * 1e3)
        self._overhead("importance", t1 - t0)
        self._overhead("solving", _clock() - t1)
        return self.selection

    def before_step(self, x, y):
        """Time one full step on this training batch (_time_gradient_step: nothing that trains
        changes), FULL_STEPS times per measurement round: the full steps run in the same
        conditions as the selection's own (the input pipeline preparing the next batches
        meanwhile), so the ratio compares like with like."""
        # interleaved with the selection's own first steps (before its steps 0, 2, 4, ...), so
        # that load which comes and goes hits both alike
        if not self.measuring:
            return
        full, own = len(self.full_times) - self.win_f, len(self.times) - self.win_t
        if full >= FULL_STEPS * self.rounds or 2 * full > own:
            return
        t0 = _clock()
        factor = self.ctl.model.full_over_grads
        self.full_times.append(
            _time_full_step(self.trainer, x, y, self.warm) if factor is None
            else factor * _time_gradient_step(self.trainer, x, y, self.warm))
        self.full_ms = statistics.median(self.full_times) * 1e3
        self.record["full_step_ms"] = self.full_ms
        self._overhead("timing full steps", _clock() - t0)

    def _solve(self, global_step, reason, **extra):
        t0 = _clock()
        model = self.ctl.model
        mask = model.select(self.importance, self.cfg.rho, resolution=self.cfg.dp_resolution)
        mask, measured_before = prefer_measured(mask, self.importance, self.measured,
                                                self.cfg.rho, self.ctl.tolerance)
        solve_ms = (_clock() - t0) * 1e3
        selection, empty = model.selection(mask)
        limited_by = model.limited_by(mask, self.importance, self.cfg.rho,
                                      resolution=self.cfg.dp_resolution)
        if empty:
            nothing_worth = not np.any(self.importance > 0)
            if nothing_worth and self.selection is not None:
                selection = self.selection
                self.log("no tensor has positive importance; keeping the previous selection "
                         f"({len(selection)} tensors)")
            elif nothing_worth:
                self.log("no tensor has positive importance; training the output-most tensor "
                         "only")
            else:
                self.log(f"no tensor worth training fits rho {self.cfg.rho:g} under this time "
                         f"model; training the output-most (cheapest) tensor only")
            mask = np.zeros(len(mask), bool)
            mask[list(selection)] = True
        ratio = model.predicted_ratio(mask)
        self.record = {
            "step": global_step, "epoch": global_step / self.steps_per_epoch, "reason": reason,
            "mask": [int(b) for b in mask], "predicted_ratio": ratio, "limited_by": limited_by,
            "solve_ms": solve_ms, "full_step_ms": None, "measured_ratio": None,
            "step_ms": None, "steps": 0, "measured_before": measured_before, **extra,
            "importance": [float(v) for v in self.importance],
        }
        self.summary["selections"].append(self.record)
        self.selection = selection
        self.mask = mask
        self.times, self.first_step_s = [], None
        self.full_ms, self.full_times = None, []
        self.rounds = 1
        self.win_t = self.win_f = 0
        self.measuring = True
        tf.summary.scalar(runlog.NUM_SELECTED, len(selection), step=global_step)
        tf.summary.scalar(runlog.PREDICTED_RATIO, ratio, step=global_step)
        tf.summary.write(runlog.SELECTION_MASK, tf.constant(mask.astype(np.int32)),
                         step=global_step)

    # ------------------------------------------------------------------ the closed loop
    def after_step(self, seconds, global_step):
        """Book one step's time; returns True when the selection was re-solved (a correction)."""
        self.record["steps"] += 1
        self.segments[-1][0] += seconds
        if self.first_step_s is None:  # may include compiling this selection's step
            self.first_step_s, self.first_seg = seconds, len(self.segments) - 1
            return False
        self.times.append(seconds)
        if not self.measuring:
            # a selection trains for --interval epochs, an hour or more on a small device: its
            # ratio is measured again now and then, in case the load or the device changed
            if len(self.times) - self.win_t >= RECHECK_STEPS:
                self.win_t, self.win_f = len(self.times), len(self.full_times)
                self.rounds, self.measuring = 1, True
                self.segments.append([0.0, None])
            return False
        if (len(self.times) - self.win_t != MEASURE_STEPS * self.rounds
                or len(self.full_times) - self.win_f < FULL_STEPS * self.rounds):
            return False
        measured = self._measured()
        self.record["measured_ratio"] = measured
        self.segments[-1][1] = measured
        self.measured[self.selection] = measured
        tf.summary.scalar(runlog.MEASURED_RATIO, measured, step=global_step)
        action, miss = self.ctl.decide(measured, self.record["limited_by"], self.was_over,
                                       self.record["predicted_ratio"], self.rounds,
                                       self.corrections_here)
        if action == "keep":
            self.win_t, self.measuring = len(self.times), False  # judged: until the re-check
            return False
        if action == "confirm":
            self.rounds += 1
            return False
        t0 = _clock()
        self.ctl.correct(self.mask, measured)
        self.corrections_here += 1
        self.was_over = self.was_over or miss == "over"
        old = (self.selection, self.record)
        self._close_record()
        self._solve(global_step, reason=f"correction ({miss} rho)")
        model = self.ctl.model
        entry = {"step": global_step, "measured_ratio": measured, "miss": miss,
                 "predicted_ratio_before": old[1]["predicted_ratio"],
                 "dw_scale": self.ctl.dw_scale, "dy_scale": self.ctl.dy_scale,
                 "fixed_ms": model.fixed_ms, "selected_before": len(old[0]),
                 "selected_after": len(self.selection)}
        self.summary["corrections"].append(entry)
        tf.summary.scalar(runlog.CORRECTIONS, len(self.summary["corrections"]), step=global_step)
        self.log(f"rho feedback: {len(old[0])} tensors measured {measured:.3f} of a full step "
                 f"for rho {self.cfg.rho:g} (predicted {old[1]['predicted_ratio']:.3f}); time "
                 f"model corrected (backward ops x{self.ctl.dw_scale:.2f} of the table's, fixed cost "
                 f"{model.fixed_ms:+.1f} ms a step), now {len(self.selection)} tensors"
                 + ("" if self.record["measured_before"] is None else
                    f" (measured {self.record['measured_before']:.3f} earlier in this run)"))
        if self.selection == old[0]:  # the same tensors again: nothing left to correct here
            self.corrections_here = self.ctl.max_corrections
        self._overhead("solving", _clock() - t0)
        return True

    def _overhead(self, part, seconds):
        self.overhead_s += seconds
        self.overhead_parts[part] += seconds

    def _measured(self):
        """The current measurement window's median step over its median full step."""
        times, full = self.times[self.win_t:], self.full_times[self.win_f:]
        if not times or not full:
            return None
        return statistics.median(times) / statistics.median(full)

    def _close_record(self):
        """Final numbers of the selection that stops training now: its median step, and its
        measured ratio, the one its measurement windows give (_full_seconds)."""
        if self.record is None:
            return
        if self.times:
            median = statistics.median(self.times)
            self.record["step_ms"] = median * 1e3
            # compiling a new selection's step is part of re-selecting
            if self.first_step_s is not None:
                compiling = max(self.first_step_s - median, 0.0)
                self._overhead("compiling", compiling)
                self.segments[self.first_seg][0] -= compiling
                if not self.compile_counted:  # a full-training run compiles its one step too
                    self.full_s += compiling
                    self.compile_counted = True
        if self.segments[-1][1] is None:  # a window still open: what it has measured so far
            self.segments[-1][1] = self._measured()
        own = sum(seconds for seconds, _ in self.segments)
        full = self._full_seconds()
        if full:
            self.record["measured_ratio"] = own / full
            self.full_s += full
        elif self.full_ms is not None:
            self.full_s += self.record["steps"] * self.full_ms / 1e3
        self.step_s += own
        self.segments, self.first_seg = [[0.0, None]], 0
        self.record = None

    def _full_seconds(self):
        """What full training would have spent on this selection's steps: each window's steps
        (every one, not their count times a median: slow steps, the first after an evaluation
        or a burst of other load, slow full training's steps too) over the ratio measured in
        that window, whose full steps ran among them.  Dividing all the selection's steps by the
        full steps of its first window alone took any load of that moment for the full step's
        cost: MobileNetV2's first selection in command 1 timed 230 ms full steps at the start
        of the run against 150 ms later, and the run estimated 0.59 of full training's wall
        clock where it took 0.72.  A window not judged takes the nearest judged one's ratio;
        None if no window measured anything."""
        known = [r for _, r in self.segments if r]
        if not known:
            return None
        total, ratio = 0.0, known[0]
        for seconds, measured in self.segments:
            ratio = measured or ratio
            total += seconds / ratio
        return total

    def state(self):
        """What a checkpoint keeps of the elastic side (the summary keeps the records)."""
        return {"importance": None if self.importance is None else list(self.importance),
                "mask": None if self.record is None else [bool(b) for b in self.mask],
                "selection": None if self.selection is None else list(self.selection),
                "open_record": self.record is not None, "full_times": self.full_times,
                "times": self.times, "corrections_here": self.corrections_here,
                "was_over": self.was_over, "rounds": self.rounds,
                "window": [self.win_t, self.win_f], "measuring": self.measuring,
                "measured": [[list(k), v] for k, v in self.measured.items()],
                "overhead_s": self.overhead_s, "overhead_parts": self.overhead_parts,
                "step_s": self.step_s, "full_s": self.full_s,
                "segments": self.segments, "compile_counted": self.compile_counted,
                "controller": self.ctl.state()}

    def load_state(self, state):
        self.importance = (None if state["importance"] is None
                           else np.asarray(state["importance"], float))
        self.selection = None if state["selection"] is None else tuple(state["selection"])
        self.mask = None if state["mask"] is None else np.asarray(state["mask"], bool)
        self.record = self.summary["selections"][-1] if state["open_record"] else None
        self.full_times = list(state["full_times"])
        self.full_ms = statistics.median(self.full_times) * 1e3 if self.full_times else None
        self.times = list(state["times"])
        self.first_step_s = None  # the first step after resuming compiles again
        self.corrections_here = state["corrections_here"]
        self.was_over = state["was_over"]
        self.rounds = state.get("rounds", 1)
        self.win_t, self.win_f = state.get("window", (0, 0))
        self.measuring = state.get("measuring", True)
        self.measured = {tuple(k): v for k, v in state.get("measured", [])}
        self.overhead_s = state["overhead_s"]
        self.overhead_parts.update(state.get("overhead_parts", {}))
        self.step_s = state.get("step_s", 0.0)
        self.full_s = state.get("full_s", 0.0)
        # a checkpoint from before the windows were kept: its steps as one window, still open
        self.segments = [list(seg) for seg in
                         state.get("segments", [[state.get("sel_s", 0.0), None]])]
        self.first_seg = len(self.segments) - 1  # the step after resuming is booked as a first
        self.compile_counted = state.get("compile_counted", False)
        self.ctl.load_state(state["controller"])

    def finish(self, train_time_s, global_step):
        """Run-level numbers: `measured_ratio` (the selections' measured step ratios weighted by
        their steps) and `wall_ratio`, this run's training time over what full training would
        have taken for the same steps: the same loop work outside the compiled step (next batch,
        bookkeeping, logging: train_time_s minus the steps and re-selecting), plus each
        selection's steps over its measured step ratio, plus compiling one step.  The wall clock
        also pays re-selecting and the loop's own per-step work, which do not shrink with rho,
        so wall_ratio is what a user's clock shows, above measured_ratio."""
        self._close_record()
        done = [s for s in self.summary["selections"] if s["measured_ratio"] is not None]
        weight = sum(s["steps"] for s in done)
        self.summary["measured_ratio"] = (
            sum(s["measured_ratio"] * s["steps"] for s in done) / weight if weight else None)
        self.summary["reselection_overhead_s"] = self.overhead_s
        self.summary["reselection_overhead_parts_s"] = dict(self.overhead_parts)
        self.summary["wall_ratio"] = wall_ratio(train_time_s, self.step_s, self.overhead_s,
                                                self.full_s)
        if self.summary["wall_ratio"] is not None:
            tf.summary.scalar(runlog.WALL_RATIO, self.summary["wall_ratio"], step=global_step)


# what re-selecting spends its time on (summary.json reselection_overhead_parts_s)
OVERHEAD_PARTS = ("importance", "timing full steps", "compiling", "solving")


def wall_ratio(train_time_s, step_s, overhead_s, full_s):
    """train_time_s / (loop work + full_s), loop work = train_time_s - step_s - overhead_s
    (_Elastic.finish); None without a measured full step."""
    if not full_s > 0:
        return None
    loop_s = max(train_time_s - step_s - overhead_s, 0.0)
    return train_time_s / (loop_s + full_s)


def _time_gradient_step(trainer, x, y, warm):
    """Seconds of a full training step's forward and backward pass on (x, y), without the
    optimizer's update (trainer.grads_fn).  The loop multiplies it by the table's t_full /
    t_grads to get a full step's time: nothing trainable changes, so unlike _time_full_step it
    keeps no copy of the weights and optimizer state (for ResNet50 with SGD, 2 x 98 MB held next
    to a full step's activations, more than an elastic run's peak saved).  The update's share of
    a step is the table's, not measured in the run: it is elementwise work that slows down with
    the device as the rest of the step does.  Non-trainable weights (moving statistics of
    normalisation in training mode) are restored."""
    return _time_restoring(trainer.grads_fn, x, y, warm, trainer.model,
                           trainer.model.non_trainable_weights)


def _time_full_step(trainer, x, y, warm):
    """Seconds of one full training step on (x, y); the model's weights (moving statistics
    included) and the optimizer's state are restored afterwards, so what trains is unchanged.
    For timing tables without t_grads_ms."""
    step = trainer.step_for(tuple(range(len(trainer.variables))))
    return _time_restoring(step, x, y, warm, trainer.model,
                           trainer.model.weights + trainer.optimizer.variables)


def _time_restoring(step, x, y, warm, model, variables):
    """Seconds of one call of `step` on (x, y), timed as the loop times its steps (waiting for
    its first output); `variables` and the model's random generators (augmentation draws) are
    put back afterwards, as if the call had not run.  A step's first call compiles, so it runs
    once untimed unless its id is in `warm` (then added)."""
    saved = [v.numpy() for v in variables]
    generators = _random_state(model)
    try:
        if id(step) not in warm:
            engine.first_output(step(x, y)).numpy()
            warm.add(id(step))
        t0 = _clock()
        engine.first_output(step(x, y)).numpy()
        return _clock() - t0
    finally:
        for v, w in zip(variables, saved):
            v.assign(w)
        for v, w in generators:
            v.assign(w)

