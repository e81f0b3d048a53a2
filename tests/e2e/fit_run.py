"""A model.fit run with ElasticCallback, on one device or under MirroredStrategy over two logical
CPUs (which only a fresh process can make): python fit_run.py KERAS MODE OUTDIR [TABLE].
Prints the history as JSON on its last line, the callback's lines on stderr
(tests/e2e/test_distribute.py, which runs the one-device one in its own process with fit()).
The one-device run is uncached, as the mirrored one must be."""
import json
import os
import sys


def fit(flavor, mode, out, table=None, log=print):
    """model.fit's history, as {metric: [one float an epoch]}; log: the callback's lines."""
    import numpy as np
    import tensorflow as tf

    from elastictrainer.keras import ElasticCallback

    keras = __import__("keras") if flavor == "keras3" else __import__("tf_keras")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (256, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 5, 256).astype("int32")
    train = tf.data.Dataset.from_tensor_slices((x[:192], y[:192])).batch(16)
    test = tf.data.Dataset.from_tensor_slices((x[192:], y[192:])).batch(16)
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if mode == "mirrored"
                else tf.distribute.get_strategy())
    with strategy.scope():  # no BatchNorm: each replica would normalise over its own share
        keras.utils.set_random_seed(0)
        inputs = keras.Input((16, 16, 3))
        h = keras.layers.Rescaling(1 / 255.0)(inputs)
        for filters in (8, 16):
            h = keras.layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(h)
        model = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(h)))
        # SGD: a wrong scale of the all-reduced gradients would show in every loss
        model.compile(optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # shuffle=False: fit ignores it for a dataset either way, and Keras 3 warns of True
    history = model.fit(train, epochs=3, validation_data=test, shuffle=False, verbose=0, callbacks=[
        ElasticCallback(rho=0.9, interval=1, logdir=out, economy=False, rho_feedback=False,
                        timing_table=table, profiles=os.path.join(out, "profiles"),
                        cache_frozen_prefix="auto" if mode == "mirrored" else False, log=log)])
    return {k: [float(v) for v in vs] for k, vs in history.history.items()}


if __name__ == "__main__":
    os.environ["ELASTICTRAINER_LOGICAL_CPUS"] = "2"  # before TensorFlow starts
    from elastictrainer.flavors import tf_setup  # noqa: F401

    print(json.dumps(fit(*sys.argv[1:], log=lambda line: print(line, file=sys.stderr))))
