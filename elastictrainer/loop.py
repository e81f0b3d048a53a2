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
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

from elastictrainer import energy, engine, runlog
from elastictrainer.common import RunError, UserError, check_writable_dir, one_line, peak_rss_mb
from elastictrainer.data.loaders import first_undecodable, load_dataset
from elastictrainer.importance import IMPORTANCE, normalize
from elastictrainer.models import is_user_model
from elastictrainer.models.build import build_sized
from elastictrainer.profiler import table as tables
from elastictrainer.profiler.run import load_or_profile
from elastictrainer.roles import check_roles, tensor_roles
from elastictrainer.schemes import SCHEMES
from elastictrainer.time_model import TimeModel
from elastictrainer.trainer import Trainer


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


def _load_time_model(cfg, model, num_classes, log):
    path = cfg.timing_table or tables.default_table_path(
        cfg.model_name, cfg.input_size, cfg.batch_size, num_classes, cfg.optimizer)
    table = load_or_profile(path, model, cfg.model_name, cfg.input_size, cfg.batch_size,
                            num_classes, seed=cfg.seed, progress=cfg.progress, log=log,
                            optimizer=cfg.optimizer)
    tm = TimeModel(table)
    if not tm.calibrated:
        log(f"note: {path} has no calibration (profiled with --calibrate false or by an older "
            f"version); re-run profiler.py so that rho holds when backward ops overlap")
    if cfg.rho < tm.rho_floor:
        raise UserError(f"--rho {cfg.rho:g} is below this model's forward floor: the forward pass "
                        f"alone is {tm.rho_floor:.3f} of a full training step ({path})")
    return tm, path


def run(cfg, log=print):
    """Train as `cfg` says; returns the summary dict (also written to summary.json)."""
    from tqdm import tqdm

    cfg.validate()
    check_writable_dir(cfg.logdir, "--logdir")  # before minutes of loading and profiling
    scheme = SCHEMES[cfg.train_type]
    keras.utils.set_random_seed(cfg.seed)
    bundle = load_dataset(cfg.dataset_name, input_size=cfg.input_size, batch_size=cfg.batch_size,
                          seed=cfg.seed, data_dir=cfg.data_dir)
    num_classes = cfg.num_classes or bundle.num_classes
    if num_classes < bundle.num_classes:
        raise UserError(f"--num_classes {num_classes} is smaller than the {bundle.num_classes} "
                        f"classes of {cfg.dataset_name}")
    requested = num_classes  # a saved model with another class count gets a new head (build.py)
    model, input_size, num_classes = build_sized(cfg.model_name, cfg.input_size, requested,
                                                 cfg.weights)
    if input_size != cfg.input_size:
        raise UserError(f"{cfg.model_name} takes {input_size}x{input_size} images; "
                        f"pass --input_size {input_size}")
    cfg = dataclasses.replace(cfg, num_classes=num_classes, run_name=cfg.resolved_run_name())

    steps_per_epoch = math.ceil(bundle.num_train / cfg.batch_size)
    if cfg.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.steps_per_epoch)
    total_steps = steps_per_epoch * cfg.num_epochs
    rng_state = _random_state(model)
    roles = check_roles(tensor_roles(model))
    optimizer = engine.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
                                      total_steps)
    trainer = Trainer(model, optimizer, scheme, roles)
    n = len(trainer.variables)
    time_model = table_path = None
    if scheme.elastic:
        time_model, table_path = _load_time_model(cfg, model, num_classes, log)
    _restore_random_state(model, rng_state, cfg.seed)

    out = runlog.run_dir(cfg.logdir, cfg.run_name)
    os.makedirs(out, exist_ok=True)
    runlog.write_json(os.path.join(out, runlog.CONFIG_FILE), dataclasses.asdict(cfg))
    writer = tf.summary.create_file_writer(out)
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

    selection = scheme.fixed_selection(roles) if not scheme.elastic else None
    reselect_every = cfg.interval * steps_per_epoch
    next_reselect = 0
    probe_iter = iter(bundle.train.repeat())
    train_time = 0.0
    global_step = 0
    best = -1.0
    run_loss = run_correct = run_seen = 0.0
    save_summary()
    with (_StopFlag() as stop, writer.as_default(), meter,
          _outcome_recorded(summary, save_summary, bundle.files)):
        for epoch in range(1, cfg.num_epochs + 1):
            meter.resume()
            bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{cfg.num_epochs}",
                       disable=not cfg.progress, unit="step", leave=False)
            ep_loss = ep_correct = ep_seen = 0.0
            ep_steps = 0
            t_epoch = time.perf_counter()
            for x, y in bundle.train.take(steps_per_epoch):
                if scheme.elastic and global_step >= next_reselect:
                    selection = _reselect(trainer, scheme, time_model, cfg, probe_iter,
                                          global_step, steps_per_epoch, summary, log)
                    next_reselect = max(next_reselect + reselect_every, global_step + 1)
                loss, logits = trainer.step_for(selection)(x, y)
                loss = float(loss)
                if not math.isfinite(loss):
                    summary["status"] = "nan"
                    train_time += time.perf_counter() - t_epoch
                    meter.pause()
                    summary.update(train_time_s=train_time, energy_j=meter.joules,
                                   avg_power_w=meter.avg_power_w)
                    save_summary()
                    raise RunError(f"the loss became {loss} at epoch {epoch}, step {global_step}; "
                                   f"try a lower --learning_rate")
                b = int(y.shape[0])
                correct = float(np.sum(np.argmax(logits.numpy(), -1) == y.numpy()))
                ep_loss += loss * b
                ep_correct += correct
                ep_seen += b
                run_loss += loss * b
                run_correct += correct
                run_seen += b
                global_step += 1
                ep_steps += 1
                if global_step % runlog.SCALAR_EVERY_STEPS == 0:
                    _write_train_scalars(trainer, run_correct, run_loss, run_seen, global_step)
                    run_loss = run_correct = run_seen = 0.0
                bar.update(1)
                bar.set_postfix(loss=f"{ep_loss / ep_seen:.3f}", acc=f"{100 * ep_correct / ep_seen:.1f}")
                if stop.requested:
                    break
            train_time += time.perf_counter() - t_epoch
            meter.pause()
            summary.update(energy_j=meter.joules, avg_power_w=meter.avg_power_w)
            bar.close()
            # An epoch whose every step ran is evaluated even if Ctrl-C came during its last
            # (possibly partial) batch.
            if stop.requested and 0 < ep_steps < steps_per_epoch:
                summary["train_time_s"] = train_time
                break
            if run_seen:
                _write_train_scalars(trainer, run_correct, run_loss, run_seen, global_step)
                run_loss = run_correct = run_seen = 0.0
            test_acc, test_loss = trainer.evaluate(bundle.test)
            tf.summary.scalar(runlog.TEST_ACCURACY, test_acc, step=global_step)
            tf.summary.scalar(runlog.TEST_LOSS, test_loss, step=global_step)
            if meter.joules is not None:
                tf.summary.scalar(runlog.ENERGY_JOULES, meter.joules, step=global_step)
            writer.flush()
            if test_acc > best:
                best = test_acc
                if cfg.save_model:
                    model.save_weights(os.path.join(out, runlog.BEST_WEIGHTS_FILE))
            summary["epochs"].append({
                "epoch": epoch, "train_time_s": train_time, "test_accuracy": test_acc,
                "test_loss": test_loss, "train_accuracy": 100 * ep_correct / max(ep_seen, 1),
                "train_loss": ep_loss / max(ep_seen, 1), "selected": len(selection),
                "energy_j": meter.joules,
            })
            summary["best_test_accuracy"] = best
            summary["train_time_s"] = train_time
            save_summary()
            log(f"epoch {epoch}: train loss {ep_loss / max(ep_seen, 1):.4f}, "
                f"test accuracy {test_acc:.2f}%, test loss {test_loss:.4f}, "
                f"training time {train_time:.1f} s, {len(selection)}/{n} tensors trained")
            if stop.requested:
                break
    writer.flush()
    summary["status"] = "interrupted" if stop.requested else "finished"
    summary["step_cache_traces"] = trainer.steps.traces
    summary["peak_rss_mb"] = peak_rss_mb()
    save_summary()
    hours = train_time / 3600
    if cfg.save_txt:
        np.savetxt(os.path.join(out, f"{cfg.run_name}.txt"), [hours, max(best, 0.0)])
    spent = (f", energy {meter.joules:.0f} J ({meter.source})" if meter.joules is not None
             else "")
    ended = (f"interrupted after {len(summary['epochs'])} of {cfg.num_epochs} epochs (run it "
             f"again to train from the start)" if stop.requested else "finished")
    log(f"{cfg.train_type} {ended}: best test accuracy {max(best, 0.0):.2f}%, "
        f"training time {hours:.4f} h ({train_time:.1f} s){spent}; results in {out}")
    return summary


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


def _reselect(trainer, scheme, time_model, cfg, probe_iter, global_step, steps_per_epoch,
              summary, log):
    """Evaluate importance on fresh probe batches, solve eq. 3, log the selection."""
    t0 = time.perf_counter()
    batches = [next(probe_iter) for _ in range(cfg.probe_batches)]
    importance = normalize(IMPORTANCE[scheme.importance](trainer, batches))
    t1 = time.perf_counter()
    mask = time_model.select(importance, cfg.rho, resolution=cfg.dp_resolution)
    solve_ms = (time.perf_counter() - t1) * 1e3
    selection, empty = time_model.selection(mask)
    if empty:
        mask[list(selection)] = True
        log("no tensor has positive importance; training the output-most tensor only")
    ratio = time_model.predicted_ratio(mask)
    summary["selections"].append({
        "step": global_step, "epoch": global_step / steps_per_epoch,
        "mask": [int(b) for b in mask], "predicted_ratio": ratio,
        "importance_ms": (t1 - t0) * 1e3, "solve_ms": solve_ms,
        "importance": [float(v) for v in importance],
    })
    tf.summary.scalar(runlog.NUM_SELECTED, len(selection), step=global_step)
    tf.summary.scalar(runlog.PREDICTED_RATIO, ratio, step=global_step)
    tf.summary.write(runlog.SELECTION_MASK, tf.constant(mask.astype(np.int32)), step=global_step)
    return selection
