"""What the distributed steps all-reduce, read from their graphs, beside their own count: a
MirroredStrategy over two logical CPUs (which only a fresh process can make) runs
CompiledSteps' steps of several selections and its probe step, and a step that all-reduces every
gradient while it returns the selection's.  python collectives_run.py; prints JSON on its last
line (tests/e2e/test_distribute.py)."""
import json
import os
import sys

os.environ["ELASTICTRAINER_LOGICAL_CPUS"] = "2"  # before TensorFlow starts

from elastictrainer.flavors import tf_setup  # noqa: E402,F401
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from elastictrainer.flavors import optimizers  # noqa: E402
from elastictrainer.method.roles import tensor_roles  # noqa: E402
from elastictrainer.method.schemes import SCHEMES  # noqa: E402
from elastictrainer.train import collectives  # noqa: E402
from elastictrainer.train.compiled import CompiledSteps  # noqa: E402
from elastictrainer.train.distribution import Distribution  # noqa: E402

GLOBAL_BATCH = 8


def unpruned_step(strategy, model, variables, selection):
    """The selection's gradients, computed and all-reduced with every other tensor's: what a
    step that failed to prune would do."""

    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True))
        grads = tape.gradient(loss, variables)
        reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                 grads)
        return [reduced[k] for k in selection]

    @tf.function
    def step(x, y):
        return strategy.run(replica, args=(x, y))

    return step


def main():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    strategy = tf.distribute.MirroredStrategy(devices)
    dist = Distribution(strategy)
    with strategy.scope():  # no BatchNorm: nothing but the gradients is all-reduced
        keras.utils.set_random_seed(0)
        inputs = keras.Input((16, 16, 3))
        h = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
        h = keras.layers.Conv2D(16, 3, strides=2, activation="relu")(h)
        model = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(h)))
        optimizer = optimizers.make_optimizer("adam", 1e-3, 0.0, 100)
        tr = CompiledSteps(model, optimizer, SCHEMES["elastic_training"], tensor_roles(model),
                           dist=dist, global_batch=GLOBAL_BATCH)
    n = len(tr.variables)
    sizes = [v.shape.num_elements() * v.dtype.size for v in tr.variables]
    x = tf.random.uniform((GLOBAL_BATCH, 16, 16, 3))
    y = tf.constant([k % 5 for k in range(GLOBAL_BATCH)])
    batch = dist.split((x, y), GLOBAL_BATCH)
    out = {"sizes": sizes, "replicas": dist.num_replicas, "steps": []}

    def record(name, selection, run, built):
        before = tr.allreduce_bytes
        run()
        step = built()
        out["steps"].append({
            "name": name, "selection": list(selection),
            "counted": tr.allreduce_bytes - before,
            "measured": collectives.allreduce_bytes(step),
            "ops": [list(a) for a in collectives.allreduces(step)]})

    for name, selection in (("every tensor", tuple(range(n))), ("the head", (n - 2, n - 1)),
                            ("one kernel", (2,)), ("kernels", (0, 2, n - 2))):
        step = tr.step_for(selection)
        record(name, selection, lambda: step(*batch), lambda: step)
    record("probe", tuple(range(n)), lambda: tr.probe_step(*batch, want_terms=True),
           lambda: tr.probe)
    unpruned = unpruned_step(strategy, model, tr.variables, (n - 2, n - 1))
    unpruned(*batch)
    out["unpruned"] = {"selection": [n - 2, n - 1],
                       "measured": collectives.allreduce_bytes(unpruned)}
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
