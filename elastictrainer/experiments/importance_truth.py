"""Importance against the truth on real fine-tunes (scripts/bench_importance.py --configs): for
every trainable tensor of a pretrained model at the start of its fine-tune, the held-out loss
drop that training it alone for a few dozen SGD steps brings, beside what each estimator of
that drop says.

What it owns: the measurement (Truth), on any Keras model of either flavour, with plain
TensorFlow steps: SGD with momentum, as the fine-tunes that use it (one compiled step for every
tensor, the others' gradients masked to zero, so that measuring 158 tensors compiles once).
Its arithmetic and tables are importance_report.py's.

The estimators, each per tensor k, from `probe` training batches at the measured state
(g = the gradient, dw = -lr g the step a fresh SGD optimizer takes, s = 1 / (1 - momentum) the
length momentum stretches a steady step by):
- taylor: -g.dw = lr |g|^2, the runtime's estimate (method/importance.py, paper eq. 4-6 with a
  fresh optimizer state);
- trial: L(w) - L(w + s dw_k) on the same batch, the loss drop of one stretched step of the
  tensor alone: first order minus the curvature the step meets (one forward pass per tensor);
- curvature: s (-g.dw) - s^2/2 dw.H.dw, the same to second order, with each tensor's own
  curvature dw_k.H_kk.dw_k from one Hessian-vector product per batch (Hutchinson: random signs
  per tensor, so the cross terms average out);
- checked: taylor scaled, depth by depth, by what one stretched step of each depth group
  (realized.GROUPS) realizes on the probes' batches against its first-order promise, or the
  plain step when no group's stretched one realizes realized.SUFFICIENT of it (--trial_check:
  elastic/realized.py, method/trial.py).
Taylor, curvature and checked are computed by the runtime's own code.

The truth: dropN, the held-out loss drop of `steps` SGD steps of tensor k alone from the state
(fresh momentum).  Losses are taken in training mode (BatchNorm on batch statistics, as every
fine-tune step computes them; moving statistics of an application pretrained with momentum
0.999 trail its weights) with every weight and statistic restored after each measurement.
The losses compared (held-out, trial) run the random layers (dropout) in inference mode, so
that a difference is the weights' and not two dropout masks' (EfficientNet-Lite0's
Dropout(0.2) moved the held-out loss of 256 images by 0.016 between two evaluations of the
same weights); the training steps keep them.
"""
import os
import time

import numpy as np

from elastictrainer.elastic import realized
from elastictrainer.flavors import batchnorm
from elastictrainer.flavors.shared import inference_calls
from elastictrainer.experiments import protocols
from elastictrainer.experiments.importance_report import split_half, summarize


class Truth:
    """The measurement on `model` (called as model(x, training=True)) with `loss_fn(y,
    logits)`, SGD at `lr` with `momentum`."""

    def __init__(self, model, loss_fn, lr, momentum=0.9):
        import tensorflow as tf

        from elastictrainer import flavors

        self.model, self.loss_fn = model, loss_fn
        self.random_layers = flavors.for_model(model).random_layers(model)
        self.lr, self.momentum = float(lr), float(momentum)
        self.variables = list(model.trainable_weights)
        self.n = len(self.variables)
        self.mask = [tf.Variable(0.0, trainable=False) for _ in self.variables]
        self.velocity = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
        variables, mask, velocity = self.variables, self.mask, self.velocity

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, variables)
            for v, g, m, u in zip(variables, grads, mask, velocity):
                if g is None:
                    continue
                u.assign(self.momentum * u - self.lr * m * tf.convert_to_tensor(g))
                v.assign_add(u)
            return loss

        loss_once = tf.function(lambda x, y: loss_fn(y, model(x, training=True)))

        def loss_at(x, y):
            """The loss compared between states: one network, the random layers (dropout,
            augmentation) in inference mode, in its trace and every call."""
            with inference_calls(self.random_layers):
                return loss_once(x, y)

        self._step, self._loss_at = step, loss_at
        self._estimators()

    def _estimators(self):
        """The runtime's own code for the estimates (method/importance.py, method/trial.py),
        on a fresh SGD optimizer of the model's Keras: the taylor terms, the curvature terms
        with their Hessian-vector product, and the trial step by depth."""
        import tensorflow as tf

        from elastictrainer import flavors
        from elastictrainer.flavors import optimizers
        from elastictrainer.method import importance
        from elastictrainer.method.trial import TrialStep

        model, loss_fn, variables = self.model, self.loss_fn, self.variables
        optimizer = flavors.for_model(model).keras.optimizers.SGD(self.lr,
                                                                  momentum=self.momentum)
        optimizers.prepare_optimizer(optimizer, variables)

        def loss_of(data):
            return loss_fn(data[1], model(data[0], training=True))

        @tf.function
        def gradient(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of((x, y))
            return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                    for g, v in zip(tape.gradient(loss, variables), variables)]

        self._gradient = gradient
        self._taylor = tf.function(importance.taylor_terms(optimizer, variables))
        curvature = importance.CurvatureTerms(optimizer, variables,
                                              stats=model.non_trainable_weights)
        hvp_at = importance.hessian_vector_product(loss_of, variables)
        self._curvature = tf.function(
            lambda grads, x, y, signs: curvature(grads, hvp_at, (x, y), signs), autograph=False)
        self.trial = TrialStep(optimizer, variables, loss_of, stats=model.non_trainable_weights,
                               random_layers=self.random_layers)

    # ------------------------------------------------------------------ state
    def snapshot(self):
        return [v.numpy() for v in self.model.weights]

    def restore(self, snap):
        for v, w in zip(self.model.weights, snap):
            v.assign(w)
        for u in self.velocity:
            u.assign(np.zeros(u.shape, u.dtype.as_numpy_dtype))

    def held_loss(self, held):
        """The loss of each held-out batch (an array), in training mode but with the random
        layers (dropout) in inference mode, so that two states are compared on one network;
        statistics restored."""
        snap = self.snapshot()
        losses = np.array([float(self._loss_at(x, y)) for x, y in held])
        for v, w in zip(self.model.weights, snap):
            v.assign(w)
        return losses

    def train(self, tensors, batches):
        """SGD steps on `batches` of the tensors `tensors` alone (momentum kept)."""
        for k, m in enumerate(self.mask):
            m.assign(1.0 if k in tensors else 0.0)
        losses = [float(self._step(x, y)) for x, y in batches]
        return losses

    # ------------------------------------------------------------------ measuring
    def estimates(self, probes, seed=0):
        """{estimator: one float per tensor} from `probes` batches (module docstring)."""
        rng = np.random.default_rng(seed)
        s = 1.0 / (1.0 - self.momentum)
        taylor, curv, trial = np.zeros(self.n), np.zeros(self.n), np.zeros(self.n)
        held = np.zeros(self.n)
        kept_grads = []
        for i, (x, y) in enumerate(probes):
            signs = rng.choice([-1.0, 1.0], self.n).astype(np.float32)
            grads = self._gradient(x, y)
            self.trial.keep((x, y), grads)  # the trial check's batches: every probe's
            taylor += self._taylor(grads).numpy()
            curv += self._curvature(grads, x, y, signs).numpy()
            stats = self.model.non_trainable_weights
            kept = [v.numpy() for v in stats]

            def loss_here():
                loss = float(self._loss_at(x, y))
                for v, w in zip(stats, kept):  # the statistics the forward moved
                    v.assign(w)
                return loss

            base = loss_here()
            xo, yo = probes[(i + 1) % len(probes)]
            other = float(self._loss_at(xo, yo))
            for v, w in zip(stats, kept):
                v.assign(w)
            for k, (v, g) in enumerate(zip(self.variables, grads)):
                w = v.numpy()
                v.assign_sub(s * self.lr * g)
                trial[k] += base - loss_here()
                held[k] += other - float(self._loss_at(xo, yo))
                for vv, ww in zip(stats, kept):
                    vv.assign(ww)
                v.assign(w)
            kept_grads.append([g.numpy().astype(np.float64).ravel() for g in grads])
        p = len(kept_grads)
        cross = np.zeros(self.n)
        for k in range(self.n):
            total = sum(g[k] for g in kept_grads)
            squares = sum(float(g[k] @ g[k]) for g in kept_grads)
            # mean over pairs i != j of g_i.g_j, times p as taylor sums over the batches
            cross[k] = self.lr * (float(total @ total) - squares) / max(p - 1, 1)
        # the runtime's --trial_check: taylor scaled by depth by what a trial step of each
        # group realizes on the probes' batches
        checked, _ = realized.checked(self.trial.drops, taylor)
        return {"taylor": taylor, "curvature": curv, "trial": trial, "trial_held": held,
                "cross": cross, "checked": checked}

    def drops(self, batches, held, tensors_list=None):
        """(dropN, held-out loss, dropN by held-out batch): dropN of each tensor (or each
        group in `tensors_list`), the held-out loss drop after SGD on `batches` of it alone,
        from the current state, which is restored after each."""
        snap = self.snapshot()
        base = self.held_loss(held)
        groups = tensors_list or [(k,) for k in range(self.n)]
        by_batch = np.zeros((len(groups), len(base)))
        for i, group in enumerate(groups):
            self.restore(snap)
            self.train(set(group), batches)
            by_batch[i] = base - self.held_loss(held)
        self.restore(snap)
        return by_batch.mean(axis=1), float(base.mean()), by_batch


# ---------------------------------------------------------------------- configurations
# The fine-tunes measured (bench_importance.py --configs): where the estimate fails (a domain
# shift, the application flat or nested as a user's model holds it) and the paper's regime on
# a real ImageNet backbone, on procedural objects and on the calibrated textures.
CONFIGS = ("domain_shift_nested", "domain_shift_fit", "efficientnet_imagenet",
           "efficientnet_textures")


def _fit_setup(name, seed, workdir, log):
    """(model, train batches iterator, held-out batches, lr, steps an epoch, --bn_mode to hold
    the model's BatchNorm in) of a model.fit configuration (experiments/fit_configs.py), from
    its pretrained weights."""
    import keras

    from elastictrainer.experiments import fit_configs, fit_task

    task = getattr(fit_task, fit_configs.FIT_CONFIGS[name].task)
    pre = fit_task.PretrainedTask(keras, os.path.join(workdir, name), seed, log=log, task=task)
    held = list(task.dataset(task.test, seed, 1).unbatch().batch(64).take(4))
    return (pre.fresh(), iter(pre.train.repeat()), held, fit_task.SHIFT_LEARNING_RATE,
            -(-task.train // task.batch), batchnorm.MODEL)


def _cli_setup(name, seed, workdir, log):
    """The same for a command-line configuration (protocols.IMAGENET_TARGETS).  Under its
    protocol's --bn_mode frozen every BatchNorm layer runs on moving statistics (--bn_mode
    inference), as that mode runs each layer a selection leaves frozen: a tensor trained alone
    leaves all the others frozen."""
    from elastictrainer.data.loaders import load_dataset
    from elastictrainer.models.build import build_sized

    p, dataset = protocols.IMAGENET_TARGETS[name]
    extra = dict(p.extra)
    bn_mode = extra.pop("bn_mode", batchnorm.MODEL)
    data = load_dataset(dataset, input_size=p.input_size,
                        batch_size=p.batch_size, seed=seed, **extra)
    model, _, _ = build_sized(protocols.IMAGENET_MODEL, p.input_size, data.num_classes,
                              p.weights, log=log, progress=False)
    held = list(data.test.unbatch().batch(64).take(4))
    return (model, iter(data.train.repeat()), held, p.learning_rate,
            -(-extra["num_train"] // p.batch_size),
            batchnorm.INFERENCE if bn_mode == batchnorm.FROZEN else batchnorm.MODEL)


def measure(name, seed=0, steps=30, probes=8, bins=8, workdir="logs/bench_time_to_accuracy",
            log=print):
    """One configuration's measurement (its pretrained weights shared with the
    time-to-accuracy benchmark's, under `workdir`): the state an elastic run's first probes see (the
    classifier head trained alone for a tenth of two epochs, the runtime's head warm-up), every
    estimator on `probes` training batches, and dropN with N = `steps` for every tensor."""
    setup = _cli_setup if name in protocols.IMAGENET_TARGETS else _fit_setup
    model, train, held, lr, per_epoch, bn_mode = setup(name, seed, workdir, log)
    with batchnorm.mode(model, bn_mode):  # every function below is traced within it
        return _measure(name, seed, steps, probes, bins, model, train, held, lr, per_epoch)


def _measure(name, seed, steps, probes, bins, model, train, held, lr, per_epoch):
    import tensorflow as tf

    tf.random.set_seed(seed)
    truth = Truth(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), lr)
    n = truth.n
    t0 = time.perf_counter()
    head = {k for k, v in enumerate(truth.variables) if _is_head(model, v)}
    truth.train(head, [next(train) for _ in range(max(1, round(0.1 * 2 * per_epoch)))])
    truth.restore(truth.snapshot())  # the warm-up's momentum is not the probes' state
    estimates = truth.estimates([next(train) for _ in range(probes)], seed=seed)
    drop, base, by_batch = truth.drops([next(train) for _ in range(steps)], held)
    names = [getattr(v, "path", None) or v.name for v in truth.variables]
    result = {"config": name, "seed": seed, "steps": steps, "probes": probes, "lr": lr,
              "held_out_loss": base, "tensor_names": names, "dropN": drop.tolist(),
              "split_half": split_half(by_batch),
              "estimates": {k: v.tolist() for k, v in estimates.items()},
              "seconds": time.perf_counter() - t0}
    result["summary"] = summarize(drop, estimates, steps, probes, bins)
    return result


def _is_head(model, variable):
    head = model.layers[-1]
    return any(variable is w for w in head.trainable_weights)
