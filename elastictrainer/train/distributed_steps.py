"""A training step and a probe step under a tf.distribute strategy (distribution.py): each
replica computes the selected tensors' gradients on its share of the global batch, only those are
all-reduced, and every replica's copy is updated with the flavor's update parts."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tensorflow as tf
import tf_keras as keras

from elastictrainer import flavors
from elastictrainer.flavors import optimizers
from elastictrainer.train.steps import ProbeStep


def _per_replica_loss(y, logits, global_batch):
    """This replica's share of the global batch's mean loss (all-reduced by SUM: the mean)."""
    per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    return tf.reduce_sum(per_example) / tf.cast(global_batch, per_example.dtype)


def _batch_stats(y, logits, loss):
    correct = tf.reduce_sum(tf.cast(tf.equal(
        tf.argmax(logits, -1, output_type=tf.int32), tf.cast(y, tf.int32)), tf.float64))
    return tf.stack([tf.cast(loss, tf.float64), correct, tf.cast(tf.shape(y)[0], tf.float64)])


class DistributedStep:
    """A train step (or, with `train` false, a probe step: every gradient, no update) under a
    tf.distribute strategy (distribution.py's module docstring).  `step(x, y)` on distributed
    batches returns (loss, stats[, grads]): the global batch's mean loss, and [loss, correct,
    examples] summed over the replicas.  `allreduce_bytes`: what one call all-reduces, known
    once traced."""

    def __init__(self, dist, model, optimizer, var_list, global_batch, penalty_fn=None,
                 train=True):
        strategy = dist.strategy
        var_list = list(var_list)
        flavor = flavors.for_optimizer(optimizer)
        replicas = strategy.num_replicas_in_sync
        self.allreduce_bytes = None

        def replica(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = _per_replica_loss(y, logits, global_batch)
                total = loss + penalty_fn() / replicas if penalty_fn is not None else loss
            grads = tape.gradient(total, var_list)
            present = [k for k, g in enumerate(grads) if g is not None]
            # what the all-reduce moves: the selected tensors' gradients, nothing else
            self.allreduce_bytes = sum(grads[k].shape.num_elements() * grads[k].dtype.size
                                       for k in present)
            reduced = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [grads[k] for k in present])
            for k, g in zip(present, reduced):
                grads[k] = g
            if train:
                grads, _ = flavor.prepare_gradients(optimizer, grads, var_list)
            return _batch_stats(y, logits, loss), grads

        @tf.function
        def step(x, y):
            if train:
                flavor.begin_update(optimizer)
            stats, grads = strategy.run(replica, args=(x, y))
            stats = strategy.reduce(tf.distribute.ReduceOp.SUM, stats, axis=None)
            if not train:
                return stats[0], stats, strategy.experimental_local_results(grads)[0]
            for g, v in zip(grads, var_list):
                strategy.extended.update(
                    optimizers.tf_variable(v), lambda var, grad: flavor.update_variable(optimizer, grad, var),
                    args=(g,), group=False)
            flavor.finish_update(optimizer, var_list)
            return stats[0], stats

        self.step = step

    def __call__(self, x, y):
        return self.step(x, y)

    def tf_functions(self):
        """The tf.function this step runs (its graph: collectives.py)."""
        return [self.step]


class DistributedProbeStep(ProbeStep):
    """ProbeStep under a strategy: every gradient of the global batch, all-reduced, and the
    importance terms from them; no update.  (loss, stats, terms)."""

    def __init__(self, dist, model, optimizer, var_list, global_batch, terms_fn=None,
                 penalty_fn=None):
        self.n = len(var_list)
        self.inner = DistributedStep(dist, model, optimizer, var_list, global_batch,
                                     penalty_fn, train=False)
        self.step = self.inner.step
        self.terms = None if terms_fn is None else tf.function(terms_fn)

    @property
    def allreduce_bytes(self):
        return self.inner.allreduce_bytes

    def tf_functions(self):
        return self.inner.tf_functions()
