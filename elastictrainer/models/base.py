"""What every built-in model shares: argument checks, the keras weights cache, weight files,
the reference's front end (augmentation, preprocessing) and its classifier head.

Structure of every built-in CNN (the reference's):
    Input(size, size, 3) float images in [0, 255]
    -> "augment_flip" RandomFlip("horizontal") -> "augment_rotation" RandomRotation(0.2)
    -> "preprocess" (caffe style for resnet50/vgg16, scale to [-1, 1] for mobilenetv2/vit)
    -> backbone called with training=False, so its BatchNorm layers use their moving statistics
       while gamma/beta still train
    -> "global_pool" GlobalAveragePooling2D -> "dropout" Dropout(0.2) -> "classifier" Dense logits.

ImageNet weights come from keras' own cache/download (keras.utils.get_file, cache_subdir "models")
rooted at $KERAS_HOME or ~/.keras. We fetch the file ourselves *before* building, so an offline
machine fails fast with a one-line UserError naming the expected cache file.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import importlib
import os
import re

import tensorflow as tf
import tf_keras as keras

from elastictrainer import flavors
from elastictrainer.flavors import compat
from elastictrainer.errors import UserError, one_line
from elastictrainer.models import MODELS

_SERIALIZABLE_PACKAGE = "elastictrainer"


def register_serializable(cls):
    """Register a custom layer so `keras.models.load_model` finds it once `models` is imported."""
    return keras.saving.register_keras_serializable(package=_SERIALIZABLE_PACKAGE)(cls)


def build_builtin(name, input_size, num_classes, weights="none"):
    """Call the builder models.MODELS declares for `name` (weights "none" or "imagenet")."""
    spec = MODELS.get_or_fail(name)
    module, function = spec.builder.split(":")
    builder = getattr(importlib.import_module(module), function)
    return builder(**spec.kwargs, input_size=input_size, num_classes=num_classes, weights=weights)


# ----------------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------------

WEIGHTS_NAMES = ("none", "imagenet", "synthetic")


def weights_kind(weights):
    """'none' | 'imagenet' | 'synthetic' | 'path' for a `weights` argument (None counts as
    'none'; a file literally named like one of these is passed as ./NAME)."""
    if weights is None:
        return "none"
    text = os.fspath(weights).strip().lower()
    if text in ("", "none"):
        return "none"
    if text in WEIGHTS_NAMES:
        return text
    return "path"


def check_input_size(input_size, minimum=32, multiple_of=1, model="model"):
    if isinstance(input_size, bool) or not isinstance(input_size, int):
        raise UserError(f"input size must be an integer, got {input_size!r}")
    if input_size < minimum:
        raise UserError(f"{model} needs an input size >= {minimum}, got {input_size}")
    if input_size % multiple_of:
        raise UserError(f"{model} needs an input size that is a multiple of {multiple_of}, got {input_size}")
    return input_size


def check_num_classes(num_classes):
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"number of classes must be a positive integer, got {num_classes!r}")
    return num_classes


# ----------------------------------------------------------------------------------------------
# weights: keras cache + user files
# ----------------------------------------------------------------------------------------------

def keras_cache_root():
    """Root of the keras cache: $KERAS_HOME or ~/.keras (files live in <root>/models).

    tf_keras' get_file ignores $KERAS_HOME, so we pass it as cache_dir explicitly. Like keras,
    an unwritable root falls back to /tmp/.keras.
    """
    root = os.path.expanduser(os.environ.get("KERAS_HOME") or os.path.join("~", ".keras"))
    try:
        os.makedirs(os.path.join(root, "models"), exist_ok=True)
    except OSError:
        pass
    if not os.access(root, os.W_OK):
        root = os.path.join("/tmp", ".keras")
    return root


def fetch_pretrained(fname, url, what, file_hash=None):
    """Path of a cached pretrained file, downloading it when missing; UserError when impossible."""
    root = keras_cache_root()
    expected = os.path.join(root, "models", fname)
    try:
        return keras.utils.get_file(fname, url, cache_subdir="models", cache_dir=root, file_hash=file_hash)
    except Exception as e:  # offline (URLError), HTTP error, hash mismatch, unwritable cache
        raise UserError(
            f"ImageNet weights for {what} are not cached and the download failed ({one_line(e)}); "
            f"put the file at {expected}, or use --weights none or --weights PATH") from e


def _looks_like_tf_checkpoint(path):
    return os.path.isfile(path + ".index")


def load_weights_file(model, path, log=print):
    """Load a weights file saved by this project (`model.save_weights`) into `model`.

    Accepts .weights.h5 / .h5 files and TF checkpoints (the prefix, e.g. run/ckpt for
    run/ckpt.index, or a directory holding a `checkpoint` file).  A file saved by a model with
    another classifier (another class count) loads everything but the classifier, which keeps
    its fresh values, and `log` says so.  Missing or mismatching files raise a one-line
    UserError naming the mismatch, and leave the model as it was.  (build.load_weights also
    takes ViT .npz checkpoints.)
    """
    path = os.path.expanduser(os.fspath(path))
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise UserError(f"weights directory {path} holds no TF checkpoint")
        path = latest
    if not (os.path.isfile(path) or _looks_like_tf_checkpoint(path)):
        raise UserError(f"weights file not found: {path}")
    before = [w.numpy() for w in model.weights]  # a failed load may have assigned some
    try:
        _load_all(model, path, model)
        return model
    except UserError as e:
        full_error = e
    head = output_head(model)
    if head is not None:
        dense, features, _ = head
        try:
            _load_all(flavors.for_model(model).functional_model(model.inputs, features, None),
                      path, model, by_name=True)
        except UserError:
            pass
        else:
            log(f"weights {path}: loaded everything but the classifier '{dense.name}', saved "
                f"with another shape (another class count); it starts from fresh values for "
                f"{dense.units} classes")
            return model
    for w, value in zip(model.weights, before):
        w.assign(value)
    raise full_error


def _load_all(model, path, named, by_name=False):
    """Load `path` into every variable of `model` (UserError naming `named` otherwise).

    by_name: legacy (Keras 2) .h5 files are matched by layer name rather than by layer order,
    and must then hold every layer of `model` that has weights (keras skips absent ones)."""
    legacy_h5 = path.lower().endswith(".h5") and not path.lower().endswith(".weights.h5")
    by_name = by_name and legacy_h5
    try:
        if by_name:
            absent = _layers_missing_from_h5(model, path)
            if absent:
                raise ValueError(f"no weights for layer(s) {', '.join(absent[:5])}")
        status = model.load_weights(path, by_name=True) if by_name else model.load_weights(path)
    except Exception as e:
        raise UserError(f"cannot load weights {path} into model {named.name}: {one_line(e)}") from e
    if status is not None and hasattr(status, "assert_existing_objects_matched"):
        # TF checkpoints restore lazily and silently skip unmatched variables: insist that every
        # model variable was matched; extra checkpoint values (e.g. optimizer slots) are fine.
        try:
            status.assert_existing_objects_matched()
        except AssertionError as e:
            found = re.search(r"Found (\d+) Python objects", str(e))
            detail = f"{found.group(1)} of its variables are not in the checkpoint" if found else one_line(e)
            raise UserError(f"weights {path} do not match model {named.name}: {detail}") from e
        finally:
            status.expect_partial()  # no "unrestored values" log spam either way


def _layers_missing_from_h5(model, path):
    import h5py

    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f else f
        saved = {n.decode() if isinstance(n, bytes) else str(n)
                 for n in group.attrs.get("layer_names", ())}
    return [layer.name for layer in model.layers if layer.weights and layer.name not in saved]


def output_head(model):
    """(dense, features, after) for a model whose output is a Dense layer's, possibly followed
    by weightless one-input layers (`after`, e.g. a Softmax), in order; `features` is the
    Dense layer's input tensor.  None when the output is made otherwise (or the model is not a
    graph of layers, e.g. subclassed)."""
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1:
        return None
    flavor = flavors.for_model(model)
    tensor, after = outputs[0], []
    while True:
        made = flavor.made_by(tensor)
        if made is None:
            return None
        layer, node_index = made
        inputs = tf.nest.flatten(compat.layer_input_tensors(layer, node_index))
        if len(inputs) != 1:
            return None
        if isinstance(layer, flavor.dense_type()):
            return layer, inputs[0], after[::-1]
        if layer.weights or flavors.is_model(layer):
            return None
        after.append(layer)
        tensor = inputs[0]


def load_pretrained_h5(backbone, path, what):
    try:
        backbone.load_weights(path)
    except Exception as e:
        raise UserError(f"cached ImageNet weights {path} for {what} do not load ({one_line(e)}); "
                        f"delete the file to re-download it, or use --weights none") from e


# ----------------------------------------------------------------------------------------------
# shared front end
# ----------------------------------------------------------------------------------------------

@register_serializable
class ImagenetPreprocess(keras.layers.Layer):
    """keras.applications.<arch>.preprocess_input as a (serializable) layer: [0, 255] RGB in."""

    _FUNCTIONS = {
        "resnet50": lambda x: keras.applications.resnet50.preprocess_input(x),
        "vgg16": lambda x: keras.applications.vgg16.preprocess_input(x),
    }

    def __init__(self, arch, **kwargs):
        super().__init__(**kwargs)
        if arch not in self._FUNCTIONS:
            raise ValueError(f"no preprocess_input for {arch!r}")
        self.arch = arch

    def call(self, inputs):
        return self._FUNCTIONS[self.arch](inputs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "arch": self.arch}


def image_input(input_size, keras=keras):
    return keras.Input(shape=(input_size, input_size, 3), name="image")


def augment(x, keras=keras):
    """The reference's training-time augmentation (identity at inference)."""
    x = keras.layers.RandomFlip("horizontal", name="augment_flip")(x)
    return keras.layers.RandomRotation(0.2, name="augment_rotation")(x)


def scale_to_unit_range(x):
    """[0, 255] -> [-1, 1] (mobilenet_v2.preprocess_input / ViT)."""
    return keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, name="preprocess")(x)


def classifier(input_size, num_classes, preprocess, make_backbone, name, keras=keras,
               augment_images=True, backbone_training=False):
    """The reference's model around a backbone: augment -> preprocess -> backbone (built by
    `make_backbone()` after the preprocessing layers) in inference mode -> global pool ->
    Dropout(0.2) -> Dense logits.  `keras`: the module to build with (tf_keras, or Keras 3 for
    a model.fit user's builder).  backbone_training: the backbone runs as the model is called
    (its BatchNorm on batch statistics in a training step, unless --bn_mode inference)."""
    inputs = image_input(input_size, keras)
    x = preprocess(augment(inputs, keras) if augment_images else inputs)
    x = make_backbone()(x, **({} if backbone_training else {"training": False}))
    x = keras.layers.GlobalAveragePooling2D(name="global_pool")(x)
    # force_generator (tf_keras): its random state is a tf.random.Generator that a checkpoint
    # saves, so a resumed run draws the same masks (the legacy ops keep theirs inside the kernel)
    extra = {"force_generator": True} if keras.__name__.startswith("tf_keras") else {}
    x = keras.layers.Dropout(0.2, name="dropout", **extra)(x)
    outputs = keras.layers.Dense(num_classes, name="classifier")(x)
    return keras.Model(inputs, outputs, name=name)
