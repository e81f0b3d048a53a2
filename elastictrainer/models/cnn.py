"""Built-in CNN classifiers: any keras.applications backbone in the reference's structure
(base.classifier), and `smallcnn`, a 20-tensor model for offline demos and smoke runs.  Which
backbone, preprocessing and ImageNet file each name uses is declared in models/__init__.py."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import tf_keras as keras

from elastictrainer.errors import UserError
from elastictrainer.models import DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES
from elastictrainer.models.base import (
    ImagenetPreprocess, check_input_size, check_num_classes, classifier, fetch_pretrained,
    load_pretrained_h5, scale_to_unit_range, weights_kind,
)

_APPS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/"


def imagenet_file(weights_file, weights_sizes=None, input_size=DEFAULT_INPUT_SIZE):
    """(file name, url) of a keras.applications "no top" ImageNet file.  `weights_file` may hold
    {rows}: keras ships those for the square sizes `weights_sizes` and falls back to 224; the
    convolution weights do not depend on the input size, so any size loads them."""
    rows = input_size if weights_sizes and input_size in weights_sizes else 224
    path = weights_file.format(rows=rows)
    return path.rsplit("/", 1)[-1], _APPS_URL + path


def build_cnn(arch, application, preprocess, weights_file, file_hash=None, weights_sizes=None,
              input_size=DEFAULT_INPUT_SIZE, num_classes=DEFAULT_NUM_CLASSES, weights="none"):
    """keras.applications.<application> (include_top=False) in the reference's structure.

    preprocess: "caffe" (keras.applications.<arch>.preprocess_input) or "unit" ([-1, 1]).
    weights: "none" or "imagenet" (models.build loads a PATH after building).
    """
    check_input_size(input_size, minimum=32, model=arch)
    check_num_classes(num_classes)
    pretrained = None
    if weights_kind(weights) == "imagenet":  # fetch first: fail fast, before spending time building
        fname, url = imagenet_file(weights_file, weights_sizes, input_size)
        pretrained = fetch_pretrained(fname, url, arch, file_hash)

    def backbone():
        # weights=None + explicit input_shape: no download and no "non-standard size" warning; we
        # load the ImageNet file ourselves exactly like keras does (backbone.load_weights).
        net = getattr(keras.applications, application)(
            include_top=False, weights=None, input_shape=(input_size, input_size, 3))
        if pretrained is not None:
            load_pretrained_h5(net, pretrained, arch)
        return net

    def prepare(x):
        if preprocess == "caffe":
            return ImagenetPreprocess(arch, name="preprocess")(x)
        return scale_to_unit_range(x)

    return classifier(input_size, num_classes, prepare, backbone, f"{arch}_classifier")


# Two conv-BN-ReLU blocks per stage, the first one strided.  Why these widths: the reference's
# augmentation (flip + rotation, ~2.8 ms a batch of 32 at 64 px on an AVX-512 CPU) is a fixed
# part of every step, elastic or not.  At (16, 32, 64) it was a third of the forward pass, the
# head alone took 0.41-0.45 of a full step, and rho 0.5 could train little beyond the head
# (ElasticTrainer 67.7% against the head alone's 73.9%).  Wider, the model's own work dominates
# the step as ResNet50's does on the paper's devices (forward 0.41 of the step), and the last
# stage is the cheapest, about a fifth of the FLOPs, as ResNet50's is.
SMALLCNN_WIDTHS = (32, 48, 64)


def build_smallcnn(input_size=DEFAULT_INPUT_SIZE, num_classes=DEFAULT_NUM_CLASSES, weights="none"):
    """Six conv-BN-ReLU blocks in the built-in models' structure (augment -> preprocess ->
    backbone in inference mode -> pool -> dropout -> classifier), 20 trainable tensors.  There
    are no ImageNet weights: it exists so that the whole pipeline (profiling, selection,
    figures) runs in minutes on the built-in synthetic data."""
    check_input_size(input_size, minimum=16, model="smallcnn")
    check_num_classes(num_classes)
    if weights_kind(weights) == "imagenet":
        raise UserError("smallcnn has no ImageNet weights; pass --weights synthetic (pretrained "
                        "here on synthetic data), none (random init) or PATH")

    def backbone():
        image = keras.Input(shape=(input_size, input_size, 3), name="features_in")
        x = image
        for stage, width in enumerate(SMALLCNN_WIDTHS, 1):
            for block in (1, 2):
                name = f"stage{stage}_block{block}"
                x = keras.layers.Conv2D(width, 3, strides=2 if block == 1 else 1, padding="same",
                                        use_bias=False, name=f"{name}_conv")(x)
                x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
                x = keras.layers.ReLU(name=f"{name}_relu")(x)
        return keras.Model(image, x, name="smallcnn")

    return classifier(input_size, num_classes, scale_to_unit_range, backbone,
                      "smallcnn_classifier")
