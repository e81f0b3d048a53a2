"""The compiled training step shared by the profiler and the training loop.

One definition of "a training step" keeps the profiled graph and the trained graph the same:
what the Tensor Timing Profiler measures is what training later runs.
"""
import common  # noqa: F401  (quiets TensorFlow logs before it is imported)

import tensorflow as tf
import tf_keras as keras


def make_loss():
    """Sparse categorical cross-entropy on logits, as the reference."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_train_step(model, optimizer, loss_fn, var_list, penalty_fn=None, capture=None):
    """A tf.function that trains only `var_list` on one batch.

    Gradients are asked for `var_list` alone, so TensorFlow prunes every backward op that no
    selected tensor needs: this pruning is where ElasticTrainer's speedup comes from.
    `capture`, if given, is a dict filled at trace time with the graph tensors `loss` and `grads`
    (in var_list order), so the profiler can analyse the dataflow of the traced graph.
    Returns (loss, logits).
    """
    var_list = list(var_list)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
            total = loss + penalty_fn() if penalty_fn is not None else loss
        grads = tape.gradient(total, var_list)
        if capture is not None:
            capture["loss"] = total
            capture["grads"] = list(grads)
        optimizer.apply_gradients(zip(grads, var_list))
        return loss, logits

    return train_step


def make_forward_step(model, loss_fn):
    """The forward pass of a training step (training-mode model call plus loss), compiled."""

    @tf.function
    def forward_step(x, y):
        logits = model(x, training=True)
        return loss_fn(y, logits), logits

    return forward_step
