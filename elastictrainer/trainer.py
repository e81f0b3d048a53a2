"""The trainer: the model, the optimizer (built once for all trainable weights) and one compiled
train step per selection, cached."""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

from collections import OrderedDict

import tensorflow as tf
import tf_keras as keras

from elastictrainer import engine


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
