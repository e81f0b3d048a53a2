"""models/: names, sizes and ImageNet weights refused in one line before any model is built."""
from elastictrainer.errors import UserError

import os

import pytest

from elastictrainer.models import MODEL_NAMES
from elastictrainer.models.build import build_model


def test_model_names_and_unknown_name():
    assert MODEL_NAMES == ("resnet50", "vgg16", "mobilenetv2", "vit", "efficientnet_lite0", "smallcnn")
    with pytest.raises(UserError) as err:
        build_model("resnet18")
    for name in MODEL_NAMES:
        assert name in str(err.value)


def test_bad_sizes_are_user_errors():
    with pytest.raises(UserError):
        build_model("vgg16", input_size=16, num_classes=3)
    with pytest.raises(UserError):
        build_model("vit", input_size=40, num_classes=3)  # not a multiple of 16
    with pytest.raises(UserError):
        build_model("vgg16", input_size=32, num_classes=0)


# ------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnet50", "vgg16", "mobilenetv2", "vit"])
def test_imagenet_offline_is_one_line_user_error(name, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "kh"))
    expected = {
        "resnet50": "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
        "vgg16": "vgg16_weights_tf_dim_ordering_tf_kernels_notop.h5",
        "mobilenetv2": "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5",
        "vit": "ViT-B_16_imagenet21k+imagenet2012.npz",
    }[name]
    from elastictrainer.models import cnn, vit

    built = []  # no network: it must fail before building the model
    monkeypatch.setattr(cnn, "classifier", lambda *a, **kw: built.append(name))
    monkeypatch.setattr(vit, "build_vit", lambda *a, **kw: built.append(name))
    with pytest.raises(UserError) as err:
        build_model(name, input_size=32, num_classes=3, weights="imagenet")
    msg = str(err.value)
    assert os.path.join(str(tmp_path / "kh"), "models", expected) in msg
    assert "--weights none" in msg and "\n" not in msg
    assert built == []
