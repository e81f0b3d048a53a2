"""One training loop for every --train_type: ElasticTrainer and its baselines.

A scheme only decides *which tensors train* (and, for the elastic schemes, re-decides it every
--interval epochs); the loop, metrics, logging, evaluation and timing are written once.
What is frozen is data: rules over tensor roles (head, normalisation, bias, kernel).
"""
import common  # noqa: F401

import dataclasses
import datetime
import math
import os
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tf_keras as keras

import engine
import runlog
import tensor_timing
from common import Registry, RunError, UserError

SCHEMES = Registry("train_type")
OPTIMIZERS = ("sgd", "adam")


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Config:
    """Every setting of a run; saved as config.json in the run directory."""
    model_name: str = "resnet50"
    dataset_name: str = "caltech_birds2011"
    train_type: str = "elastic_training"
    input_size: int = 224
    batch_size: int = 4
    num_classes: Optional[int] = None
    optimizer: str = "sgd"
    learning_rate: float = 1e-4
    weight_decay: float = 5e-4
    num_epochs: int = 12
    run_name: Optional[str] = None
    save_model: bool = False
    save_txt: bool = False
    interval: float = 4.0
    rho: float = 0.5
    seed: int = 0
    weights: str = "imagenet"
    data_dir: Optional[str] = None
    logdir: str = "logs"
    probe_batches: int = 1
    timing_table: Optional[str] = None
    steps_per_epoch: Optional[int] = None
    dp_resolution: int = 10000
    progress: bool = True

    def validate(self):
        positive = ("input_size", "batch_size", "num_epochs", "probe_batches", "dp_resolution")
        for name in positive:
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.num_classes is not None and self.num_classes < 1:
            raise UserError(f"--num_classes must be positive, got {self.num_classes}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise UserError(f"--steps_per_epoch must be positive, got {self.steps_per_epoch}")
        if not self.learning_rate > 0:
            raise UserError(f"--learning_rate must be positive, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise UserError(f"--weight_decay must be >= 0, got {self.weight_decay}")
        if not self.interval > 0:
            raise UserError(f"--interval must be positive (epochs between re-selections), "
                            f"got {self.interval}")
        if not 0 < self.rho <= 1:
            raise UserError(f"--rho is the elastic step time / full step time and must be in "
                            f"(0, 1], got {self.rho}")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        SCHEMES.get_or_fail(self.train_type)

    def resolved_run_name(self):
        if self.run_name:
            return self.run_name
        model = os.path.splitext(os.path.basename(self.model_name))[0]
        data = os.path.basename(os.path.normpath(self.dataset_name))
        rho = f"_rho{self.rho:g}" if SCHEMES[self.train_type].elastic else ""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return f"{model}_{data}_{self.train_type}{rho}_seed{self.seed}_{stamp}"


# --------------------------------------------------------------------------- tensor roles
def tensor_roles(model):
    """Role of each trainable tensor (model.trainable_weights order): 'head' (the output
    layer's), 'norm' (normalisation scale/offset), 'bias', or 'kernel' (everything else)."""
    owner = {}
    for layer in [model] + [m for m in model.submodules if isinstance(m, keras.layers.Layer)]:
        for w in getattr(layer, "_trainable_weights", []):
            owner.setdefault(id(w), layer)
    head = None
    if getattr(model, "outputs", None):
        head = model.outputs[0]._keras_history.layer
    if head is None or not head.trainable_weights:
        head = next((layer for layer in reversed(model.layers) if layer.trainable_weights), None)
    head_ids = {id(w) for w in head.trainable_weights} if head is not None else set()
    norm_types = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                  keras.layers.GroupNormalization)
    roles = []
    for w in model.trainable_weights:
        layer = owner.get(id(w))
        short = w.name.split("/")[-1].split(":")[0]
        if id(w) in head_ids:
            roles.append("head")
        elif isinstance(layer, norm_types) or short in ("gamma", "beta", "scale"):
            roles.append("norm")
        elif short == "bias" or short.endswith("_bias"):
            roles.append("bias")
        else:
            roles.append("kernel")
    return roles


# --------------------------------------------------------------------------- importance
def _probe_step_and_grads(tr, x, y):
    """One optimizer step on all weights, then the gradient at the updated weights; weights and
    optimizer state (slots, iteration count) are restored bit for bit afterwards."""
    weights0 = [v.numpy() for v in tr.variables]
    opt0 = [v.numpy() for v in tr.optimizer.variables]
    try:
        tr.step_for(tuple(range(len(tr.variables))))(x, y)
        dw = [v.numpy() - w for v, w in zip(tr.variables, weights0)]
        grads = [g.numpy() for g in tr.grads_fn(x, y)]
    finally:
        for v, w in zip(tr.variables, weights0):
            v.assign(w)
        for v, w in zip(tr.optimizer.variables, opt0):
            v.assign(w)
    return grads, dw


def taylor_importance(tr, batches):
    """Paper eq. 4-6: I_k = -sum_i g_i(w + dw) * dw_i, the first-order estimate of the loss drop
    that tensor k's update brings (dw: one optimizer step on the probe batch)."""
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        grads, dw = _probe_step_and_grads(tr, x, y)
        total += [-float(np.sum(g.astype(np.float64) * d)) for g, d in zip(grads, dw)]
    return total


def weight_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |w_k|."""
    return np.array([float(np.sum(np.abs(v.numpy()))) for v in tr.variables])


def grad_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |g_k| on the probe batches."""
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        total += [float(np.sum(np.abs(g.numpy()))) for g in tr.grads_fn(x, y)]
    return total


def normalize(importance):
    """Scale by max |I| (as the reference), so importances are comparable across evaluations."""
    m = float(np.max(np.abs(importance))) if len(importance) else 0.0
    return importance / m if m > 0 else importance


# --------------------------------------------------------------------------- schemes
@dataclass(frozen=True)
class Scheme:
    """Which tensors a --train_type trains.  roles=None: all; importance set: elastic."""
    name: str
    roles: Optional[frozenset] = None
    kernel_l1: float = 0.0
    importance: Optional[Callable] = None

    @property
    def elastic(self):
        return self.importance is not None

    def fixed_selection(self, roles):
        return tuple(k for k, r in enumerate(roles) if self.roles is None or r in self.roles)


for _scheme in (
    Scheme("full_training"),
    Scheme("traditional_tl_training", roles=frozenset({"head"})),
    Scheme("bn_plus_bias_training", roles=frozenset({"head", "norm", "bias"})),
    # The reference's PruneTrain: full training with an L1 penalty on kernels (no channel removal).
    Scheme("prunetrain", kernel_l1=1e-4),
    Scheme("elastic_training", importance=taylor_importance),
    Scheme("elastic_training_weight_magnitude", importance=weight_magnitude_importance),
    Scheme("elastic_training_grad_magnitude", importance=grad_magnitude_importance),
):
    SCHEMES.register(_scheme.name)(_scheme)


# --------------------------------------------------------------------------- step cache
class StepCache:
    """Compiled train steps keyed by selection, least recently used evicted beyond `maxsize`:
    each distinct selection is traced once, and memory stays bounded however often the
    selection changes (a fresh tf.function per re-selection leaks graph memory)."""

    def __init__(self, factory, maxsize=8):
        self.factory = factory
        self.maxsize = maxsize
        self._steps = OrderedDict()
        self.traces = 0

    def __call__(self, key):
        if key in self._steps:
            self._steps.move_to_end(key)
            return self._steps[key]
        step = self.factory(key)
        self.traces += 1
        self._steps[key] = step
        while len(self._steps) > self.maxsize:
            self._steps.popitem(last=False)
        return step

    def __len__(self):
        return len(self._steps)


# --------------------------------------------------------------------------- time model
class TimeModel:
    """The paper's eq. 3 time model on a profiled timing table.

    A selection with deepest tensor d costs t_fp + sum_sel t_dw + sum_{j<=d} t_dy (ms).  Op times
    are scaled so that training everything predicts the measured full step: with the profiler's
    calibration (tensor_timing.fit_calibration), t_dw and t_dy each by their own fitted scale,
    otherwise both by one uniform scale.
    """

    def __init__(self, table):
        tensors = table["tensors"]
        self.rank = np.array([t["rank"] for t in tensors])
        self.order = np.argsort(self.rank)  # output -> input
        t_dw = np.array([t["t_dw_ms"] for t in tensors], float)
        t_dy = np.array([t["t_dy_ms"] for t in tensors], float)
        self.t_fp = float(table["t_fp_ms"])
        self.t_full = float(table["t_full_ms"])
        scale = tensor_timing.uniform_scale(t_dw, t_dy, self.t_fp, self.t_full)
        cal = table.get("calibration")
        self.calibrated = bool(cal)
        self.t_dw = t_dw * (cal["dw_scale"] if cal else scale)
        self.t_dy = t_dy * (cal["dy_scale"] if cal else scale)

    @property
    def rho_floor(self):
        return self.t_fp / self.t_full

    def backward_budget_ms(self, rho):
        return rho * self.t_full - self.t_fp

    def cost_ms(self, mask):
        """Backward cost of a selection (mask in trainable order)."""
        return sum(tensor_timing.selection_sums(self.t_dw, self.t_dy, self.rank, mask))

    def predicted_ratio(self, mask):
        return (self.t_fp + self.cost_ms(mask)) / self.t_full

    def select(self, importance, rho, resolution=10000):
        """Exact DP selection (selection_solver_DP) within rho; mask in trainable order."""
        import selection_solver_DP as dp

        o = self.order
        res = dp.select_tensors(self.t_dw[o], self.t_dy[o], np.asarray(importance)[o],
                                self.backward_budget_ms(rho), resolution=resolution)
        mask = np.zeros(len(o), bool)
        mask[o] = np.asarray(res.mask, bool)
        return mask

    def selection(self, mask):
        """Indices to train for a mask (trainable order), and whether it was empty.  Nothing
        worth its cost (all importances <= 0) trains the output-most tensor rather than
        stalling: its cost is the smallest of all."""
        mask = np.asarray(mask, bool)
        if not mask.any():
            return (int(self.order[0]),), True
        return tuple(int(k) for k in np.nonzero(mask)[0]), False


# --------------------------------------------------------------------------- the trainer
class Trainer:
    """Holds the model, the optimizer (built once for all trainable weights) and the compiled
    steps; `step_for(selection)` gives the train step of a selection (tuple of indices)."""

    def __init__(self, model, optimizer, scheme, roles):
        self.model = model
        self.variables = list(model.trainable_weights)
        self.optimizer = optimizer
        engine.prepare_optimizer(optimizer, self.variables)
        self.loss_fn = engine.make_loss()
        kernels = [v for v, r in zip(self.variables, roles) if r != "norm" and len(v.shape) >= 2]
        penalty = None
        if scheme.kernel_l1 > 0:
            l1 = scheme.kernel_l1

            def penalty():
                return l1 * tf.add_n([tf.reduce_sum(tf.abs(k)) for k in kernels])
        self.steps = StepCache(lambda sel: engine.make_train_step(
            model, optimizer, self.loss_fn, [self.variables[k] for k in sel], penalty_fn=penalty))
        variables = self.variables

        @tf.function
        def grads_fn(x, y):
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, model(x, training=True))
            return tape.gradient(loss, variables)

        @tf.function
        def eval_fn(x, y):
            logits = model(x, training=False)
            losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), tf.cast(y, tf.int32))
            return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))

        self.grads_fn = grads_fn
        self.eval_fn = eval_fn

    def step_for(self, selection):
        return self.steps(tuple(selection))

    def evaluate(self, dataset):
        loss_sum = correct = n = 0.0
        for x, y in dataset:
            l, c = self.eval_fn(x, y)
            loss_sum += float(l)
            correct += float(c)
            n += int(y.shape[0])
        return 100.0 * correct / max(n, 1), loss_sum / max(n, 1)


def make_optimizer(cfg, total_steps):
    """sgd: momentum 0.9 with decoupled weight decay applied as lr_t x weight_decay, lr_t on one
    cosine decay over all steps: the reference's SGDW schedule exactly.  adam: plain Adam."""
    if cfg.optimizer == "adam":
        return keras.optimizers.Adam(cfg.learning_rate)
    schedule = keras.optimizers.schedules.CosineDecay(cfg.learning_rate, max(total_steps, 1))
    return keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=cfg.weight_decay or None)


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
    path = cfg.timing_table or tensor_timing.default_table_path(
        cfg.model_name, cfg.input_size, cfg.batch_size, num_classes)
    table = tensor_timing.load_or_profile(path, model, cfg.model_name, cfg.input_size,
                                          cfg.batch_size, num_classes, seed=cfg.seed,
                                          progress=cfg.progress, log=log)
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
    import data
    import models
    from tqdm import tqdm

    cfg.validate()
    scheme = SCHEMES[cfg.train_type]
    keras.utils.set_random_seed(cfg.seed)
    bundle = data.load_dataset(cfg.dataset_name, input_size=cfg.input_size,
                               batch_size=cfg.batch_size, seed=cfg.seed, data_dir=cfg.data_dir)
    num_classes = cfg.num_classes or bundle.num_classes
    if num_classes < bundle.num_classes:
        raise UserError(f"--num_classes {num_classes} is smaller than the {bundle.num_classes} "
                        f"classes of {cfg.dataset_name}")
    # a saved model keeps its own head unless --num_classes asks for a check
    requested = cfg.num_classes if models.is_user_model(cfg.model_name) else num_classes
    model, input_size, num_classes = models.build_sized(cfg.model_name, cfg.input_size, requested,
                                                        cfg.weights)
    if input_size != cfg.input_size:
        raise UserError(f"{cfg.model_name} takes {input_size}x{input_size} images; "
                        f"pass --input_size {input_size}")
    cfg = dataclasses.replace(cfg, num_classes=num_classes, run_name=cfg.resolved_run_name())

    steps_per_epoch = math.ceil(bundle.num_train / cfg.batch_size)
    if cfg.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.steps_per_epoch)
    total_steps = steps_per_epoch * cfg.num_epochs
    roles = tensor_roles(model)
    trainer = Trainer(model, make_optimizer(cfg, total_steps), scheme, roles)
    n = len(trainer.variables)
    time_model = table_path = None
    if scheme.elastic:
        time_model, table_path = _load_time_model(cfg, model, num_classes, log)

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
    with _StopFlag() as stop, writer.as_default():
        for epoch in range(1, cfg.num_epochs + 1):
            bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{cfg.num_epochs}",
                       disable=not cfg.progress, unit="step", leave=False)
            ep_loss = ep_correct = ep_seen = 0.0
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
                    summary["train_time_s"] = train_time
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
                if global_step % runlog.SCALAR_EVERY_STEPS == 0:
                    _write_train_scalars(trainer, run_correct, run_loss, run_seen, global_step)
                    run_loss = run_correct = run_seen = 0.0
                bar.update(1)
                bar.set_postfix(loss=f"{ep_loss / ep_seen:.3f}", acc=f"{100 * ep_correct / ep_seen:.1f}")
                if stop.requested:
                    break
            train_time += time.perf_counter() - t_epoch
            bar.close()
            if stop.requested and ep_seen < steps_per_epoch * cfg.batch_size and ep_seen:
                summary["train_time_s"] = train_time
                break
            if run_seen:
                _write_train_scalars(trainer, run_correct, run_loss, run_seen, global_step)
                run_loss = run_correct = run_seen = 0.0
            test_acc, test_loss = trainer.evaluate(bundle.test)
            tf.summary.scalar(runlog.TEST_ACCURACY, test_acc, step=global_step)
            tf.summary.scalar(runlog.TEST_LOSS, test_loss, step=global_step)
            writer.flush()
            if test_acc > best:
                best = test_acc
                if cfg.save_model:
                    model.save_weights(os.path.join(out, runlog.BEST_WEIGHTS_FILE))
            summary["epochs"].append({
                "epoch": epoch, "train_time_s": train_time, "test_accuracy": test_acc,
                "test_loss": test_loss, "train_accuracy": 100 * ep_correct / max(ep_seen, 1),
                "train_loss": ep_loss / max(ep_seen, 1), "selected": len(selection),
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
    save_summary()
    hours = train_time / 3600
    if cfg.save_txt:
        np.savetxt(os.path.join(out, f"{cfg.run_name}.txt"), [hours, max(best, 0.0)])
    log(f"{cfg.train_type}: best test accuracy {max(best, 0.0):.2f}%, "
        f"training time {hours:.4f} h ({train_time:.1f} s); results in {out}")
    return summary


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
    importance = normalize(scheme.importance(trainer, batches))
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
