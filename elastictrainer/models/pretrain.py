"""`--weights synthetic`: an offline stand-in for ImageNet pretraining (not in the paper).

ElasticTrainer fine-tunes *pretrained* backbones, and the built-in CNNs run their backbone in
inference mode (base.classifier: BatchNorm uses its moving statistics), so from random weights
they barely learn.  Offline, this module makes the pretraining the paper took from ImageNet:
the built-in model is trained in full on a synthetic *source* task, the `synthetic` dataset's
generator with other, disjoint classes (data.synthetic.synthetic_source_class_params: the same
kind of coloured gratings, at frequencies no target class draws), so that its features transfer
while its classes do not.

How, per model (its models.MODELS entry's `synthetic` recipe):
  1. source model = the built-in model with a SOURCE_NUM_CLASSES-way classifier; its backbone
     is trained with BatchNorm in training mode (batch statistics), on fresh source images
     (never the same one twice), with the project's own step (train_steps.make_train_step) and
     optimizer; no flips or large rotations, which turn one grating class into another, but
     where the recipe says `resample`, every image is resampled (a sub-pixel shift and a
     rotation of a few degrees, bilinear), as ImageNet pretraining's random resized crops
     resample every image;
  2. the BatchNorm moving statistics are then recomputed as the averages over source batches,
     as a pretrained backbone's are: the target model uses them in inference mode;
  3. the backbone's weights are saved, atomically, beside Keras' own weights cache
     ($KERAS_HOME/models, default ~/.keras/models) under a name holding the model, input size
     and VERSION; the classifier is not kept (the target task's is new).
Everything is seeded, so every machine with the same TensorFlow makes the same file; it is made
once, on first use, and a file that does not load is made again.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
import tf_keras as keras

from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.errors import UserError, one_line
from elastictrainer.data.synthetic import SOURCE_NUM_CLASSES, synthetic_source_examples
from elastictrainer.models import MODELS
from elastictrainer.models.base import build_builtin, keras_cache_root

# Bump when the source task or the procedure changes: cache files of another version are then
# simply not found (their name holds the version) and a new one is made.  A model's recipe is
# in the name too, as a digest (cache_path).
VERSION = 5
SOURCE_SEED = 0x5EED  # the source images' random stream and the pretraining's seed
EVAL_IMAGES = 512     # held-out source images for the accuracy the log line reports


@dataclass(frozen=True)
class Recipe:
    """How one model is pretrained (models.MODELS[name].synthetic holds these fields)."""
    steps: int                     # training steps, each on batch_size new source images
    batch_size: int = 32
    optimizer: str = "sgd"         # optimizers.make_optimizer: sgd (momentum, cosine decay) | adam
    learning_rate: float = 0.05
    weight_decay: float = 5e-4
    max_input_size: int = 128      # larger inputs would take too long on a small CPU
    calibration_batches: int = 8   # batches averaged into the BatchNorm moving statistics
    seconds_at_32: float = 10.0    # rough wall time at 32 px on 2 cores, for the log line
    # Resample every source image (RESAMPLE_SHIFT_PX, RESAMPLE_DEGREES, bilinear).  Why: the
    # target runs' rotation augmentation resamples every training image, which smooths the
    # pixel noise, while test images are not resampled.  MobileNetV2 pretrained on sharp images
    # only takes smoothed ones for another domain: the head alone, trained on rotated images,
    # reached 40% on the test images and 61% on the same images rotated (64 px, 4800 images).
    resample: bool = False


RESAMPLE_SHIFT_PX = 1.0  # uniform in +-this, in pixels
RESAMPLE_DEGREES = 5.0   # uniform in +-this: well inside the 30 degrees between source classes


def recipe(model_name):
    spec = MODELS.get_or_fail(model_name)
    if not spec.synthetic:
        valid = ", ".join(n for n, s in MODELS.items() if s.synthetic)
        raise UserError(f"{model_name} has no synthetic pretraining (only {valid} have); use "
                        f"--weights imagenet or --weights PATH")
    return Recipe(**spec.synthetic)


def cache_path(model_name, input_size):
    """The cached backbone's file: its name holds the model, the input size, VERSION and a
    digest of the model's Recipe, so a file pretrained by another procedure or recipe is not
    found (and is made anew) rather than loaded."""
    digest = hashlib.sha1(repr(sorted(dataclasses.asdict(recipe(model_name)).items()))
                          .encode()).hexdigest()[:8]
    return os.path.join(keras_cache_root(), "models",
                        f"elastictrainer_synthetic_{model_name}_i{input_size}_v{VERSION}_"
                        f"{digest}.weights.h5")


def backbone_of(model):
    """The built-in classifier's backbone: its one nested Model (base.classifier)."""
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if len(nested) != 1:
        raise ValueError(f"{model.name} is not a built-in classifier around one backbone")
    return nested[0]


def load_synthetic(model, model_name, input_size, log=print, progress=True):
    """Give the built-in `model` the synthetic-pretrained backbone, making the cache if needed.

    Returns the cache file's path."""
    rec = recipe(model_name)
    if input_size > rec.max_input_size:
        raise UserError(f"--weights synthetic pretrains {model_name} at input sizes up to "
                        f"{rec.max_input_size} (it would take too long above); use a smaller "
                        f"--input_size, or --weights imagenet or --weights PATH")
    path = cache_path(model_name, input_size)
    backbone = backbone_of(model)
    if os.path.exists(path):
        try:
            backbone.load_weights(path)
            return path
        except Exception as e:  # truncated, overwritten, another version of TensorFlow...
            log(f"--weights synthetic: the cached file {path} does not load ({one_line(e, 200)}); "
                f"making it again")
    pretrain(model_name, input_size, path, log=log, progress=progress)
    try:
        backbone.load_weights(path)
    except Exception as e:
        raise UserError(f"--weights synthetic: the file just made, {path}, does not load: "
                        f"{one_line(e)}") from e
    return path


def ensure_synthetic(model_name, input_size, log=print, progress=True):
    """Make the cached synthetic-pretrained backbone of built-in `model_name` at `input_size`
    now if it is missing (nothing for other models or sizes it does not pretrain at).  A run
    under a tf.distribute strategy calls this before entering the strategy's scope: pretraining
    is a one-device loop, whose loss reduction the strategy refuses."""
    key = str(model_name).strip().lower()
    spec = MODELS.get(key)
    if spec is None or not spec.synthetic or input_size > recipe(key).max_input_size:
        return
    path = cache_path(key, input_size)
    if not os.path.exists(path):
        pretrain(key, input_size, path, log=log, progress=progress)


def pretrain(model_name, input_size, path, log=print, progress=True):
    """Pretrain `model_name`'s backbone on the synthetic source task and save it to `path`."""
    from tqdm import tqdm

    rec = recipe(model_name)
    estimate = rec.seconds_at_32 * max(1.0, (input_size / 32) ** 2)
    log(f"--weights synthetic: pretraining {model_name} once, at {input_size} px, on the "
        f"synthetic source task ({SOURCE_NUM_CLASSES} classes disjoint from the synthetic "
        f"dataset's; {rec.steps} steps of {rec.batch_size} images), roughly {_duration(estimate)} "
        f"on 2 CPU cores; cached as {path}")
    t0 = time.perf_counter()
    keras.utils.set_random_seed(SOURCE_SEED)
    source = build_builtin(model_name, input_size, SOURCE_NUM_CLASSES)
    backbone = backbone_of(source)
    image = keras.Input(shape=(input_size, input_size, 3), name="image")
    x = resample(image, input_size) if rec.resample else image
    x = source.get_layer("preprocess")(x)
    x = backbone(x, training=True)  # BatchNorm on batch statistics: trainable from scratch
    x = source.get_layer("global_pool")(x)
    net = keras.Model(image, source.get_layer("classifier")(x), name=f"{model_name}_source")

    optimizer = optimizers.prepare_optimizer(
        optimizers.make_optimizer(rec.optimizer, rec.learning_rate, rec.weight_decay, rec.steps),
        net.trainable_weights)
    step = train_steps.make_train_step(net, optimizer, train_steps.make_loss(), net.trainable_weights)
    train = synthetic_source_examples(input_size, rec.steps * rec.batch_size, SOURCE_SEED, split=0)
    bar = tqdm(total=rec.steps, desc=f"pretraining {model_name} (synthetic source)", unit="step",
               disable=not progress, leave=False)
    seen = correct = 0
    for x, y in train.batch(rec.batch_size).prefetch(tf.data.AUTOTUNE):
        loss, logits = step(x, y)
        loss = float(loss)
        if not np.isfinite(loss):
            bar.close()
            raise RuntimeError(f"pretraining {model_name} diverged (loss {loss})")
        correct += int(np.sum(np.argmax(logits.numpy(), -1) == y.numpy()))
        seen += int(y.shape[0])
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", acc=f"{100 * correct / seen:.1f}")
        if bar.n % 50 == 0:
            seen = correct = 0  # recent accuracy, not since the start
    bar.close()

    calibrate_batchnorm(backbone, source.get_layer("preprocess"), input_size, rec)
    accuracy = _source_accuracy(source, input_size, rec.batch_size)
    _save_atomically(backbone, path)
    log(f"--weights synthetic: pretrained {model_name} in {time.perf_counter() - t0:.0f} s "
        f"(source task test accuracy {accuracy:.1f}%, inference mode); saved {path}")
    return accuracy


def resample(image, input_size):
    """Random sub-pixel shift and small rotation of each image (Recipe.resample), seeded."""
    shift = RESAMPLE_SHIFT_PX / input_size
    x = keras.layers.RandomTranslation((-shift, shift), (-shift, shift), fill_mode="reflect",
                                       interpolation="bilinear", seed=SOURCE_SEED,
                                       name="source_resample_shift")(image)
    return keras.layers.RandomRotation(RESAMPLE_DEGREES / 360, fill_mode="reflect",
                                       interpolation="bilinear", seed=SOURCE_SEED + 1,
                                       name="source_resample_rotation")(x)


def calibrate_batchnorm(backbone, preprocess, input_size, rec):
    """Set every BatchNorm's moving mean/variance to the average of its batch statistics over
    `rec.calibration_batches` source batches (the statistics training left behind lag the
    final weights: momentum 0.99 averages over the last ~100 steps)."""
    norms = [layer for layer in backbone.submodules
             if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    data = synthetic_source_examples(input_size, rec.calibration_batches * 2 * rec.batch_size,
                                     SOURCE_SEED, split=2).batch(2 * rec.batch_size)
    try:
        for i, (x, _) in enumerate(data):
            for layer in norms:  # moving <- moving * m + batch * (1 - m): a running mean
                layer.momentum = i / (i + 1)
            backbone(preprocess(x), training=True)  # eager: the momenta are read on each call
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum


def _source_accuracy(source, input_size, batch_size):
    """Top-1 (%) on held-out source images, the backbone in inference mode as in fine-tuning."""
    correct = 0
    for x, y in synthetic_source_examples(input_size, EVAL_IMAGES, SOURCE_SEED,
                                          split=1).batch(2 * batch_size):
        logits = source(x, training=False)
        correct += int(np.sum(np.argmax(logits.numpy(), -1) == y.numpy()))
    return 100.0 * correct / EVAL_IMAGES


def _save_atomically(backbone, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # ".weights.h5" ending: keras picks the file format by name
    tmp = f"{path[:-len('.weights.h5')]}.tmp{os.getpid()}.weights.h5"
    try:
        backbone.save_weights(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"--weights synthetic: cannot write {path} ({one_line(e, 200)}); set "
                        f"$KERAS_HOME to a writable folder") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _duration(seconds):
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
