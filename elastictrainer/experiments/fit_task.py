"""The pretrained Keras 3 task the benchmarks fine-tune through model.fit (time to accuracy,
the prefix cache): a small CNN with the built-in models' random flip and rotation in front,
pretrained on the synthetic source task, then fine-tuned on the synthetic target classes.

What it owns: the data, the model, its pretraining (kept on disk beside the runs) and the
epoch clock that turns a fit into a curve of (training seconds, validation accuracy).  Every
scheme starts from the same pretrained weights (PretrainedTask.fresh), so a plain fit, a
hand-frozen last stage and ElasticCallback compare like with like."""
import os
import shutil
import time

# Image side, batch, target train/test images, source images and pretraining epochs: the size
# of README command 1, so its numbers and this task's read side by side.
SIZE, BATCH, TRAIN, TEST, SOURCE, PRETRAIN_EPOCHS = 64, 32, 4800, 1024, 7200, 4
# the layer names of the last stage: "frozen below" it, a Keras user's hand-frozen baseline
LAST_STAGE = "stage2"


def dataset(n, seed, split, source=False):
    """Batched synthetic examples (data/synthetic.py): split 0 is the training split,
    reshuffled every epoch."""
    import tensorflow as tf

    from elastictrainer.data import synthetic

    make = synthetic.synthetic_source_examples if source else synthetic.synthetic_examples
    ds = make(SIZE, n, seed=seed, split=split).cache()
    if split == 0:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def build_model(keras, classes):
    """Three stages of two 3x3 convolutions with BatchNorm, a global pool and a dense head."""
    inputs = keras.Input((SIZE, SIZE, 3))
    # the built-in models' augmentation (models/base.py), which the cache keeps as views
    x = keras.layers.RandomFlip("horizontal")(inputs)
    x = keras.layers.RandomRotation(0.2)(x)
    x = keras.layers.Rescaling(1 / 255.0)(x)
    for stage, filters in enumerate((32, 48, 64)):
        for k in range(2):
            x = keras.layers.Conv2D(filters, 3, strides=2 if k == 0 else 1, padding="same",
                                    use_bias=False, name=f"stage{stage}_conv{k}")(x)
            x = keras.layers.BatchNormalization(name=f"stage{stage}_bn{k}")(x)
            x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x), name="tta_cnn")


def epoch_clock(keras, clock=time.perf_counter):
    """A Keras callback whose `points` are each epoch's end: (seconds so far, validation
    accuracy in %).  The seconds are the run's training time as the command line counts it,
    validation excluded, plus what the callbacks after this one do before the first epoch
    (ElasticCallback's first profiling and planning): put it first in the list."""
    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.points, self.spent, self.start = [], 0.0, None
            self.began = clock()

        def on_epoch_begin(self, epoch, logs=None):
            self.start = clock()
            if self.began is not None:  # the setup before the first epoch
                self.spent += self.start - self.began
                self.began = None

        def on_train_batch_end(self, batch, logs=None):
            self.last = clock()

        def on_epoch_end(self, epoch, logs=None):
            self.spent += self.last - self.start
            self.points.append((self.spent, 100.0 * float(logs["val_accuracy"])))
    return Clock()


def first_run_callback(logdir, **settings):
    """ElasticCallback(**settings) for a run in `logdir` (emptied first) that pays for its
    first profiling, as a user's first run does: its table goes to logdir/profiles and none
    is kept in the process from a run before (profiler/reuse.py)."""
    from elastictrainer.fit.callback import ElasticCallback
    from elastictrainer.profiler import reuse

    reuse.forget()
    shutil.rmtree(logdir, ignore_errors=True)
    return ElasticCallback(logdir=logdir, profiles=os.path.join(logdir, "profiles"), log=None,
                           **settings)


class PretrainedTask:
    """The task for one seed: the source model pretrained once into `workdir` (read back
    when it is there), the target data, and fresh models from those weights."""

    def __init__(self, keras, workdir, seed, log=print):
        from elastictrainer.data import synthetic

        self.keras, self.seed = keras, seed
        os.makedirs(workdir, exist_ok=True)
        self.classes = synthetic.NUM_CLASSES["synthetic"]
        keras.utils.set_random_seed(seed)
        path = os.path.join(workdir, "pretrained.weights.h5")
        self.source = build_model(keras, synthetic.SOURCE_NUM_CLASSES)
        if not os.path.exists(path):
            log("--- pretraining on the synthetic source task")
            self.source.compile(keras.optimizers.Adam(1e-3), self._loss(),
                                metrics=["accuracy"])
            self.source.fit(dataset(SOURCE, seed, 0, source=True), epochs=PRETRAIN_EPOCHS,
                            verbose=0)
            self.source.save_weights(path)
        self.source.load_weights(path)
        self.train = dataset(TRAIN, seed, 0)
        self.test = dataset(TEST, seed, 1)

    def _loss(self):
        return self.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def fresh(self, frozen_below=None):
        """A compiled model with the pretrained weights below its new head; frozen_below: the
        stages named before it frozen by hand (trainable False)."""
        keras = self.keras
        keras.utils.set_random_seed(self.seed)
        model = build_model(keras, self.classes)
        for layer, src in zip(model.layers[:-1], self.source.layers[:-1]):
            layer.set_weights(src.get_weights())
        if frozen_below is not None:
            for layer in model.layers:
                if layer.name < frozen_below and layer.name.startswith("stage"):
                    layer.trainable = False
        model.compile(keras.optimizers.Adam(1e-3), self._loss(), metrics=["accuracy"])
        return model

    def warm_up(self):
        """One short fit: TensorFlow's first traces, paid before any timed run."""
        self.fresh().fit(self.train.take(20), epochs=1, verbose=0)
