"""The trainer: the model, the optimizer (built once for all trainable weights) and one compiled
train step per selection, cached."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

from collections import OrderedDict

import tensorflow as tf
import tf_keras as keras

from elastictrainer import flavors
from elastictrainer.flavors import compat
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.train import distributed_steps
from elastictrainer.machine import release_memory
from elastictrainer.errors import UserError
from elastictrainer.method.importance import in_step_terms, one_device_only


# Resident memory a cached step's graphs hold, per byte of their serialized GraphDef: ResNet50 at
# 224 px, batch 4 (scripts/bench_memory.py's investigation): a 71-tensor step serializes to
# 0.5 MB and each one cached added 20-90 MB of RSS (after malloc_trim); clearing 6 cached steps
# returned 170 MB.  An estimate, on the high side.
GRAPH_RSS_FACTOR = 50
# Default budget of the step cache (estimated resident bytes): ResNet50's full step (~40 MB
# estimated) plus three partial ones; small models stay bounded by the count alone.
STEP_CACHE_BYTES = 128 * 2**20
# Compiled selection steps a run keeps: the current one.  An elastic run's probe step (every
# gradient, no update) peaks about 40 MB under full training's step, and each further
# selection's graph held on to about as much (MobileNetV2 at 224 px, batch 4, SGD, three
# selections compiled: peak 1141 MB against full training's 1118-1122 MB; the current one
# alone, the dropped ones released: 1095 MB).  A selection trained again is compiled again,
# which the economy prices like any other (elastic/economy.py).
STEPS_KEPT = 1


class StepCache:
    """Compiled train steps keyed by selection, least recently used evicted beyond `maxsize`
    steps (STEPS_KEPT by default) or beyond `max_bytes` of their graphs, `on_evict()` called
    after each eviction: each selection is traced once while it is kept, and
    memory stays bounded however often the selection changes (a fresh tf.function per
    re-selection leaks graph memory).

    A step is traced at its first call, so its size is known only then: `size_fn(step)` (bytes;
    None while not yet known) is asked again at each lookup until it answers, and the step just
    looked up is never evicted.  The default size_fn, resident_bytes, estimates what a step's
    traced graphs keep resident.
    """

    def __init__(self, factory, maxsize=STEPS_KEPT, max_bytes=STEP_CACHE_BYTES, size_fn=None,
                 on_evict=release_memory):
        self.factory = factory
        self.maxsize = maxsize
        self.on_evict = on_evict
        self.max_bytes = max_bytes
        self.size_fn = size_fn or resident_bytes
        self._steps = OrderedDict()
        self._sizes = {}
        self.traces = 0
        self.evictions = 0

    def __call__(self, key):
        if key in self._steps:
            self._steps.move_to_end(key)
            step = self._steps[key]
        else:
            step = self.factory(key)
            self.traces += 1
            self._steps[key] = step
        self._evict(keep=key)
        return step

    def _evict(self, keep):
        while len(self._steps) > self.maxsize:
            self._drop(next(iter(self._steps)))
        if self.max_bytes is None:
            return
        for k, step in self._steps.items():
            if self._sizes.get(k) is None:
                self._sizes[k] = self.size_fn(step)
        for k in list(self._steps):
            if self.nbytes <= self.max_bytes:
                break
            if k != keep:
                self._drop(k)

    def _drop(self, key):
        del self._steps[key]
        self._sizes.pop(key, None)
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict()  # a dropped graph's memory goes back to the OS, not to a free list

    @property
    def nbytes(self):
        """Known size of the cached steps, in bytes."""
        return sum(v for v in self._sizes.values() if v is not None)

    def __len__(self):
        return len(self._steps)

    def __contains__(self, key):
        return key in self._steps


def resident_bytes(step):
    """Estimated resident memory of a traced step: GRAPH_RSS_FACTOR x graph_bytes."""
    size = graph_bytes(step)
    return None if size is None else GRAPH_RSS_FACTOR * size


def graph_bytes(step):
    """Serialized size of the graphs a tf.function has traced so far, None before its first
    trace: a proxy for the memory its concrete functions hold."""
    # a step with its prefix cached (prefix_cache.CachedStep) holds several functions
    fns = [f for fn in (step.tf_functions() if hasattr(step, "tf_functions") else [step])
           for f in compat.concrete_functions(fn)]
    if not fns:
        return None
    return sum(f.graph.as_graph_def().ByteSize() for f in fns)


class CountedStep:
    """A distributed step that reports each call to `count(step)` (CompiledSteps sums what its
    steps all-reduce); its graph stays reachable through tf_functions()."""

    def __init__(self, step, count):
        self.step, self.count = step, count

    def __call__(self, x, y):
        outputs = self.step(x, y)
        self.count(self.step)
        return outputs

    def tf_functions(self):
        return self.step.tf_functions()


class CompiledSteps:
    """Holds the model, the optimizer (built once for all trainable weights) and the compiled
    steps; `step_for(selection)` gives the train step of a selection (tuple of indices).
    prefix_cache: a prefix_cache.PrefixCache, whose steps then train the selections that leave
    a frozen prefix (--cache_frozen_prefix); bn_hold: a batchnorm.FrozenHold (--bn_mode
    frozen), which step_for holds the selection's frozen BatchNorm layers with, and the steps
    that compute every gradient none; trial: keep the probes' batches for the trial step by
    depth (method/trial.py, --trial_check), `self.trial`, one device only."""

    def __init__(self, model, optimizer, scheme, roles, dist=None, global_batch=None,
                 prefix_cache=None, bn_hold=None, trial=False):
        self.model = model
        self.variables = list(model.trainable_weights)
        self.optimizer = optimizer
        # under tf.distribute (distribute.Distribution), steps take distributed batches
        self.dist = dist if dist is not None and dist.on else None
        self.global_batch = global_batch
        self.allreduce_bytes = 0  # all-reduced by the steps run so far (under a strategy)
        self.steps_run = 0
        optimizers.prepare_optimizer(optimizer, self.variables)
        self.loss_fn = train_steps.make_loss()
        # a batch's training loss as the steps compute it (the trial step's, the pace check's)
        self.loss_of = lambda data: self.loss_fn(data[1], model(data[0], training=True))
        kernels = [v for v, r in zip(self.variables, roles) if r != "norm" and len(v.shape) >= 2]
        penalty = None
        if scheme.kernel_l1 > 0:
            l1 = scheme.kernel_l1

            def penalty():
                return l1 * tf.add_n([tf.reduce_sum(tf.abs(k)) for k in kernels])
        if self.dist:  # bounded by count: a distributed step is not one tf.function
            self.steps = StepCache(self._counted_step, size_fn=lambda step: None)
        else:
            self.steps = StepCache(self._step)
        self.prefix_cache = prefix_cache
        self.bn_hold = bn_hold
        # every tensor's gradient, no update: the importance probes that need their own
        # backward passes (importance.py), and the profiler
        grads = train_steps.make_gradient_step(model, self.loss_fn, self.variables)

        def grads_fn(x, y):
            self._hold(None)
            return grads(x, y)

        self.grads_fn = grads_fn
        # an elastic scheme's probe and timed full steps (every gradient, no update;
        # elastic/driver.py), built on first use
        self._probe = None
        self._penalty = penalty
        self._terms = (in_step_terms(scheme.importance, optimizer, self.variables)
                       if scheme.importance else None)
        one_device = one_device_only(self._terms, f"--train_type {scheme.name}",
                                     trial and "--trial_check")
        if one_device and self.dist:
            raise UserError(f"{one_device}; under tf.distribute use --train_type "
                            f"elastic_training without --trial_check")
        self.trial = None
        if trial:
            from elastictrainer.method.trial import TrialStep

            self.trial = TrialStep(
                optimizer, self.variables, self.loss_of,
                stats=model.non_trainable_weights,
                random_layers=flavors.for_model(model).random_layers(model))

        @tf.function
        def eval_fn(x, y):
            logits = model(x, training=False)
            losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), tf.cast(y, tf.int32))
            return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))

        self.eval_fn = eval_fn

    def step_for(self, selection):
        self._hold(selection)  # before the step (and its prefix plan) is traced
        return self.steps(tuple(selection))

    def _hold(self, selection):
        if self.bn_hold is not None:
            self.bn_hold.hold(selection)

    def _step(self, selection):
        def plain():
            return train_steps.make_train_step(self.model, self.optimizer, self.loss_fn,
                                          [self.variables[k] for k in selection],
                                          penalty_fn=self._penalty)
        if self.prefix_cache is None:
            return plain()
        def suffix_step(suffix, cut):
            return train_steps.make_train_step(suffix, self.optimizer, self.loss_fn,
                                               [self.variables[k] for k in selection],
                                               penalty_fn=self._penalty)
        return self.prefix_cache.step(selection, plain, suffix_step)

    def probe_traced(self, want_terms=False):
        """Whether a probe step with `want_terms` runs without compiling anything."""
        return self._probe is not None and self._probe.traced(want_terms)

    def probe_step(self, x, y, want_terms):
        """Every tensor's gradient and the importance terms when `want_terms`, no update
        (train_steps.make_probe_step): (loss, logits, terms)."""
        self._hold(None)
        if self._probe is None:
            terms = self._terms
            if self.dist:
                self._probe = distributed_steps.DistributedProbeStep(
                    self.dist, self.model, self.optimizer, self.variables, self.global_batch,
                    terms, self._penalty)
            else:
                self._probe = train_steps.make_probe_step(
                    self.model, self.optimizer, self.loss_fn, self.variables, terms,
                    self._penalty, keep=None if self.trial is None else self.trial.keep)
        outputs = self._probe(x, y, want_terms)
        if self.dist:
            self._count(self._probe)
        return outputs

    def _counted_step(self, selection):
        """A distributed train step of `selection` that counts its all-reduced bytes."""
        step = distributed_steps.DistributedStep(self.dist, self.model, self.optimizer,
                                      [self.variables[k] for k in selection], self.global_batch,
                                      self._penalty)
        return CountedStep(step, self._count)

    @property
    def probe(self):
        """The probe step built so far (every gradient, no update), None before the first."""
        return self._probe

    def _count(self, step):
        self.allreduce_bytes += step.allreduce_bytes or 0
        self.steps_run += 1

    def batch_stats(self, outputs, y):
        """(mean loss, correct, examples) of a trained batch from its step's outputs: (loss,
        logits) on one device, (loss, [loss, correct, examples] over the replicas) under a
        strategy."""
        if self.dist:
            _, correct, n = outputs[1].numpy()
            return float(outputs[0]), float(correct), int(n)
        logits, labels = outputs[1].numpy(), y.numpy()
        return (float(outputs[0]), float((logits.argmax(-1) == labels).sum()),
                int(labels.shape[0]))

    @property
    def in_step(self):
        """Whether this scheme's importance comes from the probe steps themselves."""
        return self._terms is not None

    def evaluate(self, dataset):
        loss_sum = correct = n = 0.0
        for x, y in dataset:
            l, c = self.eval_fn(x, y)
            loss_sum += float(l)
            correct += float(c)
            n += int(y.shape[0])
        return 100.0 * correct / max(n, 1), loss_sum / max(n, 1)
