"""Tensor importance (paper Sec. 4.1, eq. 4-6) and the ablations of Fig. 22.

Each estimator takes the trainer (compiled.CompiledSteps: `variables`, `optimizer`, `grads_fn`) and a
list of probe batches, and returns one float per trainable tensor (model.trainable_weights
order); higher means training the tensor lowers the loss more.  The elastic schemes (schemes.py)
name their estimator in IMPORTANCE.

Every Taylor estimator rests on one probe per batch: g0 = the gradient at the weights w, dw = the
optimizer's step on all weights from g0, g1 = the gradient at w + dw; weights and optimizer
state are restored afterwards.

- `taylor_paper` is eq. 4-6 exactly: -g1.dw, dw from training's optimizer state.  It collapses:
  on smallcnn (Adam 3e-3) 16, then 6, then 6 of 20 tensors score positive.  Two
  causes, measured by scripts/bench_importance.py (figures/bench_importance.json): the loss drop
  to second order is -g1.dw + dw.H.dw/2, so -g1.dw is biased low by the curvature term, which
  dominates when steps are large against the gradient (Adam's steps do not shrink with it, and
  all tensors step at once, so g1 also carries every other tensor's overshoot); and dw follows
  the optimizer's state (SGD's momentum, Adam's moments), not only the probe's gradient, so it
  favours tensors that already trained.  Even exactly, the one-step drop it estimates ranks
  tensors poorly by what their training brings (rank correlation 0.25 on average between the
  held-out drop of one step and of 32 steps, -0.54 to 0.98).
- `taylor` (what elastic_training uses) is -g0.dw0 with dw0 the step from a fresh optimizer
  state: the first-order loss drop of a step as the optimizer would take it for any tensor,
  trained or not.  Its rank correlation with the held-out loss drop of 32 steps of each tensor
  alone is 0.50 on average over SGD 1e-4 and Adam 1e-3/3e-3, from random, pretrained and
  elastic-run states (eq. 4-6: 0.03), and no estimate was negative there.  It is
  lr (|g|^2 + wd g.w) under SGD and ~ lr |g|_1 under Adam (sign-like first step), so under
  Adam it ranks as the |g| ablation (Fig. 22) does; it costs one backward pass per probe
  batch, eq. 4-6 two.
- `taylor_curvature` (elastic_training_curvature) is `taylor` at the length momentum stretches
  a steady step to, less the curvature each tensor's own step meets (CurvatureTerms): across a
  domain shift `taylor` prefers the tensors that see pixels, whose training alone raises the
  held-out loss (figures/bench_importance_truth.md); one Hessian-vector product per probe
  batch more.
"""
import weakref

import numpy as np

from elastictrainer.errors import Registry

IMPORTANCE = Registry("importance")
# The same estimates computed inside a full training step from the gradients it takes anyway
# (elastic/driver.py's probe steps): name -> factory(optimizer, variables) giving
# terms(grads) -> one float64 per tensor, or None where the estimator needs more than one
# backward pass (taylor_paper) or the optimizer has no closed-form fresh step.
IN_STEP = Registry("in-step importance")


# The compiled functions each trainer's probes use, built on first use: trainer -> {name: fn}.
# Weak keys: they go with their trainer, whose steps they belong beside.
_COMPILED = weakref.WeakKeyDictionary()


def _compiled(tr, name, build):
    fns = _COMPILED.setdefault(tr, {})
    if name not in fns:
        fns[name] = build()
    return fns[name]


def _probe_apply(tr):
    """A compiled update of all of `tr`'s weights from given gradients (built once per
    trainer)."""
    return _compiled(tr, "apply", lambda: _build_probe_apply(tr))


def _build_probe_apply(tr):
    import tensorflow as tf

    from elastictrainer.flavors import optimizers

    variables, optimizer = list(tr.variables), tr.optimizer

    @tf.function
    def fn(grads):
        optimizers.apply_updates(optimizer, grads, variables)

    return fn


def probe_terms(tr, batches, fresh_state=False, after=True):
    """Per-tensor sums over `batches` of -g0.dw and (if `after`, else None) -g1.dw (see the
    module docstring), from which every Taylor estimator follows.  fresh_state: the step from
    zeroed optimizer slots (momenta, Adam's moments and per-tensor step counts), the
    learning-rate schedule kept.  Weights and optimizer variables are restored bit for bit.

    Memory: besides the snapshot the restore needs, dw and the gradients are taken one tensor
    at a time in float64 and dropped (whole float64 copies of them raised an elastic run's peak
    above full training's)."""
    n = len(tr.variables)
    first = np.zeros(n)
    second = np.zeros(n) if after else None
    for x, y in batches:
        weights0 = [v.numpy() for v in tr.variables]
        opt0 = [v.numpy() for v in tr.optimizer.variables]
        try:
            g0 = list(tr.grads_fn(x, y))
            if fresh_state:
                for v in tr.optimizer.variables:
                    # slots and step counts; not the iteration count nor Keras 3's learning
                    # rate variable (the schedule's position is kept)
                    if v is not tr.optimizer.iterations and "learning_rate" not in v.name:
                        v.assign(np.zeros_like(v.numpy()))
            _probe_apply(tr)(g0)
            g1 = list(tr.grads_fn(x, y)) if after else None
            for k, (v, w) in enumerate(zip(tr.variables, weights0)):
                d = v.numpy().astype(np.float64) - w
                first[k] -= float(np.sum(g0[k].numpy().astype(np.float64) * d))
                if after:
                    second[k] -= float(np.sum(g1[k].numpy().astype(np.float64) * d))
                    g1[k] = None
                g0[k] = d = None  # free as we go
        finally:
            for v, w in zip(tr.variables, weights0):
                v.assign(w)
            for v, w in zip(tr.optimizer.variables, opt0):
                v.assign(w)
    return first, second


def _fresh_drop_fn(tr):
    """A compiled probe: per tensor, -g0.dw0 with dw0 optimizers.fresh_step's closed form
    (built once per trainer)."""
    return _compiled(tr, "fresh_drop", lambda: _build_fresh_drop(tr))


def _build_fresh_drop(tr):
    import tensorflow as tf

    # not `tr` itself: the function is kept in _COMPILED, whose key it must not hold
    variables, optimizer, grads_fn = list(tr.variables), tr.optimizer, tr.grads_fn

    @tf.function
    def fn(x, y):
        return fresh_drops(optimizer, grads_fn(x, y), variables)[1]

    return fn


@IMPORTANCE.register("taylor")
def taylor_importance(tr, batches):
    """What elastic_training uses: I_k = -g(w) . dw0_k, the first-order loss drop of the step
    dw0 the optimizer takes on the probe batch from a fresh state (zeroed momenta, moments and
    step counts; the learning-rate schedule kept): lr (|g_k|^2 + wd g_k.w_k) for SGD,
    ~ lr |g_k|_1 for Adam.  One backward pass per probe batch (eq. 4-6 takes two).

    dw0 in closed form where optimizers.fresh_step covers the optimizer (SGD, Adam as make_optimizer
    builds them): no weight or slot is copied, updated or restored, so the probe holds no more
    than a backward pass does; otherwise the general path (probe_terms)."""
    from elastictrainer.flavors import optimizers

    if not optimizers.fresh_step_supported(tr.optimizer, tr.variables):
        return probe_terms(tr, batches, fresh_state=True, after=False)[0]
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        total += _fresh_drop_fn(tr)(x, y).numpy()
    return total


@IMPORTANCE.register("taylor_paper")
def taylor_paper_importance(tr, batches):
    """Paper eq. 4-6 exactly: I_k = -g(w + dw) . dw, dw one optimizer step on all weights from
    training's optimizer state, g at the updated weights (the elastic_training_taylor_paper
    scheme; see the module docstring for why elastic_training does not use it)."""
    return probe_terms(tr, batches)[1]


@IMPORTANCE.register("taylor_curvature")
def taylor_curvature_importance(tr, batches):
    """taylor_curvature where the steps cannot compute it (an optimizer without a closed-form
    fresh step): the first-order term alone, as `taylor`."""
    return taylor_importance(tr, batches)


@IMPORTANCE.register("weight_magnitude")
def weight_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |w_k|."""
    return np.array([float(np.sum(np.abs(v.numpy()))) for v in tr.variables])


@IMPORTANCE.register("grad_magnitude")
def grad_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |g_k| on the probe batches."""
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        total += [float(np.sum(np.abs(g.numpy()))) for g in tr.grads_fn(x, y)]
    return total


def _dense(grads, variables):
    """Sparse gradients as the dense sum the optimizer's de-duplication gives; a tensor the
    loss does not reach has gradient 0."""
    import tensorflow as tf

    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)]


def momentum_stretch(optimizer):
    """s = 1 / (1 - momentum): how much longer than a fresh step dw0 a steady step is under
    momentum (1 without it).  The curvature a step meets grows with its length squared, so
    the estimates that weigh it (CurvatureTerms, method/trial.py) take the steady length."""
    momentum = float(getattr(optimizer, "momentum", 0.0) or 0.0)
    return 1.0 / (1.0 - momentum) if 0.0 <= momentum < 1.0 else 1.0


def fresh_drops(optimizer, grads, variables):
    """(dw0, drops): the step dw0 a fresh optimizer state takes from `grads`
    (optimizers.fresh_step's closed form, dense) and its first-order loss drop per tensor,
    -g_k . dw0_k (float64, stacked).  Eq. 4-6's term as `taylor` computes it, in a graph."""
    import tensorflow as tf

    from elastictrainer.flavors import optimizers

    grads = _dense(grads, variables)
    steps = [tf.convert_to_tensor(d) for d in optimizers.fresh_step(optimizer, grads, variables)]
    return steps, tf.stack([-tf.reduce_sum(tf.cast(g, tf.float64) * tf.cast(d, tf.float64))
                            for g, d in zip(grads, steps)])


@IN_STEP.register("taylor")
def taylor_terms(optimizer, variables):
    """taylor_importance's -g0.dw0 per tensor, from the step's own gradients (the closed-form
    fresh step, before the step's update changes the weights)."""
    from elastictrainer.flavors import optimizers

    if not optimizers.fresh_step_supported(optimizer, variables):
        return None

    def terms(grads):
        return fresh_drops(optimizer, grads, variables)[1]
    return terms


@IN_STEP.register("grad_magnitude")
def grad_magnitude_terms(optimizer, variables):
    def terms(grads):
        import tensorflow as tf

        return tf.stack([tf.reduce_sum(tf.abs(tf.cast(g, tf.float64)))
                         for g in _dense(grads, variables)])
    return terms


@IN_STEP.register("weight_magnitude")
def weight_magnitude_terms(optimizer, variables):
    def terms(grads):
        import tensorflow as tf

        return tf.stack([tf.reduce_sum(tf.abs(tf.cast(v, tf.float64))) for v in variables])
    return terms


class CurvatureTerms:
    """In-step form of `taylor_curvature` (module docstring): per tensor k, the loss drop of
    the fresh step dw0 stretched to the length momentum gives a steady step, s = 1 / (1 -
    momentum) (1 without momentum), to second order:

        I_k = s (-g0_k . dw0_k) - s^2 / 2 dw0_k . H_kk . dw0_k

    with each tensor's own curvature from one Hessian-vector product on the probe's batch,
    H v for v = sum_j e_j dw0_j (e_j = +-1 at random per tensor): e_k dw0_k . (H v)_k has
    expectation dw0_k . H_kk . dw0_k, the other tensors' cross terms averaging out over signs
    (Hutchinson).  The curvature is the local one, at w (a finite step of every tensor at once,
    as eq. 4-6's second gradient takes, mixes every tensor's overshoot into each one's term,
    and a step of some tensors against their gradient meets another curvature than the step
    training takes).  The statistics the product's forward pass moves (`stats`, BatchNorm's
    moving averages) are put back.

    Why: under SGD the first-order term is lr |g|^2, and across a domain shift the tensors that
    see pixels have the largest gradients, yet training them alone raises the held-out loss
    (figures/bench_importance_truth.md: the 70% selection of the first-order estimate, 9
    tensors down to the first convolution, raised it; this estimate's, 8 tensors from the 22nd
    on, lowered it by 0.32)."""

    needs_batch = True

    def __init__(self, optimizer, variables, stats=()):
        self.optimizer, self.variables, self.stats = optimizer, list(variables), list(stats)
        self.stretch = momentum_stretch(optimizer)

    def __call__(self, grads, hvp_at, data, signs=None):
        """The terms (float64, one per tensor) from the probe's gradients `grads` and
        `hvp_at(data, vector)`, the Hessian-vector product of the training loss on the same
        batch at the current weights (a training step's forward pass: a metric it updates
        counts this pass too); signs: the e_k (random when None)."""
        import tensorflow as tf

        from elastictrainer.flavors import optimizers

        variables, s = self.variables, self.stretch
        steps, first = fresh_drops(self.optimizer, grads, variables)
        if signs is None:
            signs = tf.where(tf.random.uniform([len(variables)]) < 0.5, -1.0, 1.0)
        kept = [tf.identity(optimizers.tf_variable(v)) for v in self.stats]
        vector = [tf.cast(signs[k], d.dtype) * d for k, d in enumerate(steps)]
        with tf.control_dependencies(kept):
            products = _dense(hvp_at(data, vector), variables)
        with tf.control_dependencies([tf.convert_to_tensor(h) for h in products]):
            for v, w in zip(self.stats, kept):
                optimizers.tf_variable(v).assign(w)
        own = tf.stack([tf.cast(signs[k], tf.float64)
                        * tf.reduce_sum(tf.cast(d, tf.float64) * tf.cast(h, tf.float64))
                        for k, (h, d) in enumerate(zip(products, steps))])
        return s * first - 0.5 * s * s * own


def hessian_vector_product(loss_of, variables):
    """hvp_at(data, vector) for CurvatureTerms: H v of `loss_of(data)` (a training forward pass
    and its loss) with respect to `variables`, by differentiating g . v (v held constant)."""
    import tensorflow as tf

    def hvp_at(data, vector):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = loss_of(data)
            grads = _dense(inner.gradient(loss, variables), variables)
            dot = tf.add_n([tf.reduce_sum(g * tf.stop_gradient(tf.cast(v, g.dtype)))
                            for g, v in zip(grads, vector)])
        return outer.gradient(dot, variables)

    return hvp_at


@IN_STEP.register("taylor_curvature")
def curvature_terms(optimizer, variables):
    from elastictrainer.flavors import optimizers

    if not optimizers.fresh_step_supported(optimizer, variables):
        return None
    return CurvatureTerms(optimizer, variables)


def one_device_only(terms, importance_setting, trial_setting=None):
    """What of a trainer's settings takes one device's batch a second time, as the start of
    the line a trainer under tf.distribute refuses them with, or None: in-step terms that
    need the batch (CurvatureTerms' Hessian-vector product), named by importance_setting,
    and the trial step by depth (method/trial.py), named by trial_setting when it is on."""
    needs = []
    if getattr(terms, "needs_batch", False):
        needs.append(f"{importance_setting} takes a second gradient")
    if trial_setting:
        needs.append(f"{trial_setting} steps")
    return " and ".join(needs) + " on one device's batch" if needs else None


def in_step_terms(name, optimizer, variables):
    """The in-step form of importance `name` for this optimizer, or None (IN_STEP)."""
    factory = IN_STEP.get(name)
    return None if factory is None else factory(optimizer, variables)


def normalize(importance):
    """Scale by max |I| (as the reference), so importances are comparable across evaluations."""
    m = float(np.max(np.abs(importance))) if len(importance) else 0.0
    return importance / m if m > 0 else importance
