"""The pretrained Keras 3 tasks the benchmarks fine-tune through model.fit (time to accuracy,
the prefix cache), each a FitTask:
  * CNN (keras3_fit): a small CNN with the built-in models' random flip and rotation in front,
    pretrained on the synthetic source task, then fine-tuned on the synthetic target classes
    with Adam;
  * SHIFTED_MOBILENETV2 (domain_shift_fit): Keras' own MobileNetV2 (keras.applications,
    weights=None), pretrained on the synthetic source task, then fine-tuned with SGD (momentum
    0.9) on the synthetic target classes seen through a domain shift (data/domain_shift.py:
    rotated, colours permuted and inverted, noisy), so that the layers that see pixels must move.

What it owns: the data, the models, their pretraining (kept on disk beside the runs) and the
epoch clock that turns a fit into a curve of (training seconds, validation accuracy).  Every
scheme starts from the same pretrained weights (PretrainedTask.fresh), so a plain fit, a
hand-frozen last stage and ElasticCallback compare like with like."""
import dataclasses
import os
import shutil
import time

from elastictrainer.data.domain_shift import DomainShift

# Image side, batch, target train/test images, source images and pretraining epochs: the size
# of the smallcnn setting, so its numbers and this task's read side by side.
SIZE, BATCH, TRAIN, TEST, SOURCE, PRETRAIN_EPOCHS = 64, 32, 4800, 1024, 7200, 4
# the layer names of the last stage: "frozen below" it, a Keras user's hand-frozen baseline
LAST_STAGE = "stage2"


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


# MobileNetV2's input side and width multiplier in domain_shift_fit: sized so that its
# pretraining and each fine-tune fit in minutes on two cores
MNV2_SIZE, MNV2_ALPHA = 64, 0.35
# Its BatchNorm momentum: Keras' default for the layer, not the application's 0.999, whose
# moving averages trail a fine-tune of a few hundred steps so far that plain fit's validation
# accuracy would measure that lag (its weights classify the shifted images far better on
# statistics recalibrated to them) rather than what it learned
MNV2_BN_MOMENTUM = 0.99


def build_mobilenetv2(keras, classes):
    """keras.applications.MobileNetV2 (weights=None, no top, average pooled) with a dense head,
    as one flat functional model: its layers are the application's, in its order."""
    inputs = keras.Input((MNV2_SIZE, MNV2_SIZE, 3))
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)  # the application's [-1, 1]
    base = keras.applications.MobileNetV2(input_tensor=x, alpha=MNV2_ALPHA, include_top=False,
                                          weights=None, pooling="avg")
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = MNV2_BN_MOMENTUM
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(base.output),
                       name="tta_mobilenetv2")


# The nested application's width: the transfer-learning guide's MobileNetV2 at alpha 0.5
NESTED_ALPHA = 0.5


def build_nested_mobilenetv2(keras, classes):
    """A user's model as Keras' transfer-learning guide builds it: keras.applications.MobileNetV2
    (weights=None, no top, average pooled, alpha NESTED_ALPHA) called as one layer inside the
    user's model, before a dense head, its BatchNorm momentum the application's own (0.999)."""
    inputs = keras.Input((MNV2_SIZE, MNV2_SIZE, 3))
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    base = keras.applications.MobileNetV2(input_shape=(MNV2_SIZE, MNV2_SIZE, 3),
                                          alpha=NESTED_ALPHA, include_top=False, weights=None,
                                          pooling="avg")
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(base(x)),
                       name="tta_nested_mobilenetv2")


def batchnorm_layers(keras, model):
    """Every BatchNormalization layer of `model`, nested models' included."""
    return [layer for layer in leaf_layers(model.layers)
            if isinstance(layer, keras.layers.BatchNormalization)]


def _adam(keras):
    return keras.optimizers.Adam(1e-3)


def _sgd(keras):
    return keras.optimizers.SGD(SHIFT_LEARNING_RATE, momentum=0.9)


@dataclasses.dataclass(frozen=True)
class FitTask:
    """A task: image side, batch, target train/test images, source images, pretraining epochs;
    build(keras, classes), a model whose last layer is its head; last_stage, the name prefix
    of its last stage's first layer (the hand-frozen baseline trains from there on); the
    fine-tune's optimizer(keras); the domain shift of the target's images (None: none)."""
    size: int
    batch: int
    train: int
    test: int
    source: int
    pretrain_epochs: int
    build: object
    last_stage: str
    optimizer: object = _adam
    shift: object = None
    pretrain_batch: int = None  # None: the fine-tune's batch
    # batches after pretraining that set BatchNorm's moving statistics to the final weights'
    # (recalibrate_batchnorm; 0: none)
    recalibrate_batches: int = 0

    def dataset(self, n, seed, split, source=False):
        """Batched synthetic examples (data/synthetic.py), the target's shifted: split 0 is
        the training split, reshuffled every epoch."""
        import tensorflow as tf

        from elastictrainer.data import domain_shift, synthetic

        make = synthetic.synthetic_source_examples if source else synthetic.synthetic_examples
        ds = make(self.size, n, seed=seed, split=split)
        if self.shift is not None and not source:
            ds = domain_shift.shifted(ds, self.shift, split=split)
        ds = ds.cache()
        if split == 0:
            ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
        batch = self.pretrain_batch if source and self.pretrain_batch else self.batch
        return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


CNN = FitTask(SIZE, BATCH, TRAIN, TEST, SOURCE, PRETRAIN_EPOCHS, build_model, LAST_STAGE)
# domain_shift_fit: the fine-tune's learning rate; of 0.03, 0.01 and 0.003 in plain fit on all
# weights (with the application's BatchNorm momentum), 0.03 learned least and the other two
# alike within plain fit's epoch-to-epoch noise; at MNV2_BN_MOMENTUM plain fit converges at it
SHIFT_LEARNING_RATE = 0.01
# the shift is DomainShift()'s, the one --dataset_name synthetic_shifted takes on the command line
SHIFTED_MOBILENETV2 = FitTask(MNV2_SIZE, 16, 1600, 512, 8000, 10, build_mobilenetv2,
                              "block_13_", optimizer=_sgd, pretrain_batch=32,
                              recalibrate_batches=50,
                              shift=DomainShift())
# The same fine-tune with the application nested in the user's model at its own BatchNorm
# momentum, on 3360 training images (210 steps an epoch)
SHIFTED_NESTED_MOBILENETV2 = dataclasses.replace(
    SHIFTED_MOBILENETV2, build=build_nested_mobilenetv2, train=3360, test=1024,
    last_stage="block_16_")


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


def first_run_callback(logdir, log=None, **settings):
    """ElasticCallback(**settings) for a run in `logdir` (emptied first) that pays for its
    first profiling, as a user's first run does: its table goes to logdir/profiles and none
    is kept in the process from a run before (profiler/reuse.py).  log: where its lines go
    (None: nowhere)."""
    from elastictrainer.fit.callback import ElasticCallback
    from elastictrainer.profiler import reuse

    reuse.forget()
    shutil.rmtree(logdir, ignore_errors=True)
    return ElasticCallback(logdir=logdir, profiles=os.path.join(logdir, "profiles"), log=log,
                           **settings)


def leaf_layers(layers):
    """`layers` with each nested model replaced by its own layers, in order."""
    out = []
    for layer in layers:
        out += leaf_layers(layer.layers) if hasattr(layer, "layers") else [layer]
    return out


def frozen_before(layers, prefix):
    """The layers a user freezes by hand to train from the first layer named `prefix...` on:
    those with weights before it (a layer without weights has nothing to freeze).  A nested
    model's layers count in its place, in their order."""
    layers = leaf_layers(layers)
    names = [layer.name for layer in layers]
    first = next((i for i, name in enumerate(names) if name.startswith(prefix)), None)
    if first is None:
        raise ValueError(f"no layer is named {prefix}...")
    return [layer for layer in layers[:first] if layer.weights]


def recalibrate_batchnorm(keras, model, batches, momentum=0.9):
    """Sets every BatchNorm layer's moving statistics to those of `model`'s current weights, by
    forward passes over `batches` in training mode (no weight changes), each moving average
    taking `momentum` for the passes.  Why: keras.applications' BatchNorm keeps 0.999 of its
    average per step, so after a pretraining of a few thousand steps the averages lag the
    weights, which still classify well on batch statistics but near chance on the moving ones
    a fine-tune's frozen layers and every evaluation use."""
    norms = batchnorm_layers(keras, model)
    kept = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = momentum
    for x, _ in batches:
        model(x, training=True)
    for layer, m in zip(norms, kept):
        layer.momentum = m


class PretrainedTask:
    """The task for one seed: the source model pretrained once into `workdir` (read back
    when it is there), the target data, and fresh models from those weights."""

    def __init__(self, keras, workdir, seed, log=print, task=CNN):
        from elastictrainer import runlog
        from elastictrainer.data import synthetic

        self.keras, self.seed, self.task = keras, seed, task
        os.makedirs(workdir, exist_ok=True)
        self.classes = synthetic.NUM_CLASSES["synthetic"]
        keras.utils.set_random_seed(seed)
        path = os.path.join(workdir, "pretrained.weights.h5")
        self.source = task.build(keras, synthetic.SOURCE_NUM_CLASSES)
        if not os.path.exists(path):
            log("--- pretraining on the synthetic source task")
            self.source.compile(keras.optimizers.Adam(1e-3), self._loss(),
                                metrics=["accuracy"])
            t0 = time.perf_counter()
            self.source.fit(task.dataset(task.source, seed, 0, source=True),
                            epochs=task.pretrain_epochs, verbose=0)
            if task.recalibrate_batches:
                recalibrate_batchnorm(keras, self.source, task.dataset(
                    task.source, seed, 0, source=True).take(task.recalibrate_batches))
            seconds = time.perf_counter() - t0
            # how well it learned its own domain, on images it did not train on
            _, accuracy = self.source.evaluate(task.dataset(task.test, seed, 1, source=True),
                                               verbose=0)
            log(f"    pretrained in {seconds:.0f} s: source test accuracy {100 * accuracy:.1f}%")
            runlog.write_json(os.path.join(workdir, "pretrained.json"),
                              {"seconds": seconds, "source_test_accuracy": 100 * accuracy})
            self.source.save_weights(path)
        self.source.load_weights(path)
        self.train = task.dataset(task.train, seed, 0)
        self.test = task.dataset(task.test, seed, 1)

    def _loss(self):
        return self.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def fresh(self, frozen_below=None):
        """A compiled model with the pretrained weights below its new head; frozen_below: the
        name prefix of the last stage's first layer, every layer before it frozen by hand
        (trainable False, so a BatchNorm among them runs on its moving statistics)."""
        keras = self.keras
        keras.utils.set_random_seed(self.seed)
        model = self.task.build(keras, self.classes)
        for layer, src in zip(model.layers[:-1], self.source.layers[:-1]):
            layer.set_weights(src.get_weights())
        if frozen_below is not None:
            for layer in frozen_before(model.layers, frozen_below):
                layer.trainable = False
        model.compile(self.task.optimizer(keras), self._loss(), metrics=["accuracy"])
        return model

    def warm_up(self):
        """One short fit: TensorFlow's first traces, paid before any timed run."""
        self.fresh().fit(self.train.take(20), epochs=1, verbose=0)
