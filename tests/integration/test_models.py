"""models/: built-in builders, weights handling (the ImageNet cache, PATH, user models), ViT .npz
loader."""
from elastictrainer.errors import UserError

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from elastictrainer.models.build import build_model, load_weights as load_weights_file, replace_head
from elastictrainer.models.vit import MultiHeadDotProductAttention, build_vit, load_vit_npz, npz_table


pytestmark = pytest.mark.tf_versions

TINY_VIT = dict(patch_size=8, hidden=32, depth=2, heads=4, mlp_dim=64)


def _images(size, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, size, size, 3)).astype("float32")


def _tiny_vit(input_size=32, num_classes=5, weights=None, **kw):
    model = build_vit(input_size, num_classes, **{**TINY_VIT, **kw})
    return load_weights_file(model, weights) if weights else model


# ------------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,size,count", [
    ("resnet50", 32, 214), ("vgg16", 32, 28), ("mobilenetv2", 32, 158), ("vit", 32, 200),
    ("smallcnn", 16, 20),
])
def test_builtin_models_build_and_run(name, size, count):
    model = build_model(name, input_size=size, num_classes=7, weights="none")
    assert isinstance(model, keras.Model)
    assert model.input_shape == (None, size, size, 3)
    assert model.output_shape == (None, 7)
    assert len(model.trainable_weights) == count
    logits = model(_images(size, batch=3), training=True).numpy()
    assert logits.shape == (3, 7) and np.isfinite(logits).all()
    names = [layer.name for layer in model.layers]
    assert names[1:4] == ["augment_flip", "augment_rotation", "preprocess"]
    if name == "vit":
        assert names[-1] == "head" and names[-2] == "class_token"
    else:
        assert names[-3:] == ["global_pool", "dropout", "classifier"]
        backbone = {"resnet50": "resnet50", "vgg16": "vgg16", "mobilenetv2": f"mobilenetv2_1.00_{size}",
                    "smallcnn": "smallcnn"}[name]
        assert names[4] == backbone and isinstance(model.layers[4], keras.Model)


def test_smallcnn_has_no_pretrained_weights_but_loads_a_path(tmp_path):
    with pytest.raises(UserError, match="no ImageNet weights.*synthetic"):
        build_model("smallcnn", input_size=16, num_classes=3, weights="imagenet")
    model = build_model("smallcnn", input_size=16, num_classes=3)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    again = build_model("smallcnn", input_size=16, num_classes=3, weights=path)
    for a, b in zip(model.weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_backbone_runs_in_inference_mode():
    """BatchNorm moving stats stay put in a training step; gamma/beta get gradients."""
    model = build_model("mobilenetv2", input_size=32, num_classes=3)
    backbone = model.get_layer("mobilenetv2_1.00_32")
    moving = [w for w in backbone.weights if "moving_mean" in w.name][0]
    before = moving.numpy().copy()
    x = _images(32, batch=4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True))
    grads = tape.gradient(loss, model.trainable_weights)
    np.testing.assert_array_equal(moving.numpy(), before)
    assert all(g is not None for g in grads)


def test_vit_trains_end_to_end_and_is_ordered():
    model = _tiny_vit()
    names = [w.name for w in model.trainable_weights]
    assert names[:4] == ["embedding/kernel:0", "embedding/bias:0", "cls/cls:0",
                         "Transformer_posembed_input/pos_embedding:0"]
    assert names[-2:] == ["head/kernel:0", "head/bias:0"]
    blocks = [int(n.split("_")[2]) for n in names if n.startswith("Transformer_encoderblock_")]
    assert blocks == sorted(blocks) and len(blocks) == 16 * TINY_VIT["depth"]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(_images(32), training=True) ** 2)
    grads = tape.gradient(loss, model.trainable_weights)
    assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(_images(32, batch=4), np.arange(4) % 5, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_attention_matches_keras_multi_head_attention():
    """Our 2-D q/k/v/out layout is the documented reshape of keras' (and the npz's) per-head layout."""
    hidden, heads = 16, 4
    x = np.random.default_rng(1).normal(size=(2, 5, hidden)).astype("float32")
    ours = MultiHeadDotProductAttention(heads)
    ours(x)
    rng = np.random.default_rng(2)
    for w in ours.weights:
        w.assign(rng.normal(size=w.shape).astype("float32"))
    ref = keras.layers.MultiHeadAttention(heads, hidden // heads)
    ref(x, x)
    hd = hidden // heads
    ref.set_weights([
        ours.query_kernel.numpy().reshape(hidden, heads, hd), ours.query_bias.numpy().reshape(heads, hd),
        ours.key_kernel.numpy().reshape(hidden, heads, hd), ours.key_bias.numpy().reshape(heads, hd),
        ours.value_kernel.numpy().reshape(hidden, heads, hd), ours.value_bias.numpy().reshape(heads, hd),
        ours.out_kernel.numpy().reshape(heads, hd, hidden), ours.out_bias.numpy(),
    ])
    np.testing.assert_allclose(ours(x).numpy(), ref(x, x).numpy(), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------

def test_imagenet_uses_cached_file(tmp_path, monkeypatch):
    """A file already in the keras cache is loaded (mobilenetv2's files carry no hash)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    donor = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3))
    rng = np.random.default_rng(3)
    donor.set_weights([rng.normal(size=w.shape).astype("float32") for w in donor.weights])
    os.makedirs(tmp_path / "models")
    donor.save_weights(str(tmp_path / "models" / "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5"))
    model = build_model("mobilenetv2", input_size=32, num_classes=3, weights="imagenet")
    backbone = model.get_layer("mobilenetv2_1.00_32")
    for a, b in zip(backbone.weights, donor.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("fmt", ["h5", "tf"])
def test_weights_path_round_trip(fmt, tmp_path):
    src = build_model("mobilenetv2", input_size=32, num_classes=4)
    path = str(tmp_path / ("w.h5" if fmt == "h5" else "ckpt"))
    src.save_weights(path)
    dst = build_model("mobilenetv2", input_size=32, num_classes=4, weights=path)
    assert len(src.weights) == len(dst.weights)
    for a, b in zip(src.weights, dst.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    x = _images(32)
    np.testing.assert_allclose(src(x, training=False).numpy(), dst(x, training=False).numpy(), rtol=1e-5, atol=1e-5)


def test_vit_weights_path_round_trip(tmp_path):
    src = _tiny_vit()
    path = str(tmp_path / "vit.h5")
    src.save_weights(path)
    dst = _tiny_vit(weights=path)
    for a, b in zip(src.weights, dst.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bad_weights_path(tmp_path):
    with pytest.raises(UserError) as err:
        build_model("mobilenetv2", input_size=32, num_classes=4, weights=str(tmp_path / "missing.h5"))
    assert "missing.h5" in str(err.value) and "\n" not in str(err.value)
    # a weights file of another architecture / class count
    other = _tiny_vit(num_classes=4)
    for path in (str(tmp_path / "other.h5"), str(tmp_path / "other_ckpt")):
        other.save_weights(path)
        with pytest.raises(UserError) as err:
            build_model("mobilenetv2", input_size=32, num_classes=4, weights=path)
        assert "\n" not in str(err.value)
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"not hdf5")
    with pytest.raises(UserError):
        load_weights_file(other, str(garbage))


# ------------------------------------------------------------------------------------------------
# user models
# ------------------------------------------------------------------------------------------------

def test_user_keras_model(tmp_path):
    inputs = keras.Input((24, 24, 3))
    x = keras.layers.Conv2D(4, 3)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(6)(x)
    user = keras.Model(inputs, outputs)
    path = str(tmp_path / "mine.keras")
    user.save(path)
    loaded = build_model(path)
    assert loaded.input_shape == (None, 24, 24, 3) and loaded.output_shape == (None, 6)
    for a, b in zip(user.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert build_model(path, input_size=224, num_classes=6).output_shape == (None, 6)
    with pytest.raises(UserError) as err:
        build_model(str(tmp_path / "absent.keras"))
    assert "absent.keras" in str(err.value)
    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(b"junk")
    with pytest.raises(UserError) as err:
        build_model(str(corrupt))
    assert "corrupt.h5" in str(err.value) and "\n" not in str(err.value)


def test_saved_vit_reloads_as_user_model(tmp_path):
    """Our custom ViT layers are serializable: a saved tiny ViT comes back through build_model."""
    model = _tiny_vit(num_classes=3)
    path = str(tmp_path / "vit.keras")
    model.save(path)
    loaded = build_model(path, num_classes=3)
    x = _images(32)
    # training=False: keras' RandomFlip/RandomRotation default to training=True when called bare
    np.testing.assert_allclose(model(x, training=False).numpy(), loaded(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-5)
    assert [w.name for w in loaded.weights] == [w.name for w in model.weights]


# ------------------------------------------------------------------------------------------------
# ViT .npz checkpoints
# ------------------------------------------------------------------------------------------------

def _fake_npz(path, grid, patch=8, hidden=32, depth=2, heads=4, mlp=64, classes=11, drop=()):
    rng = np.random.default_rng(4)
    hd = hidden // heads

    def r(*shape):
        return rng.normal(size=shape).astype("float32")

    arrays = {
        "embedding/kernel": r(patch, patch, 3, hidden), "embedding/bias": r(hidden), "cls": r(1, 1, hidden),
        "Transformer/posembed_input/pos_embedding": r(1, 1 + grid * grid, hidden),
        "Transformer/encoder_norm/scale": r(hidden), "Transformer/encoder_norm/bias": r(hidden),
        "head/kernel": r(hidden, classes), "head/bias": r(classes),
        "pre_logits/kernel": r(hidden, hidden), "pre_logits/bias": r(hidden),
    }
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            arrays[f"{b}/{ln}/scale"], arrays[f"{b}/{ln}/bias"] = r(hidden), r(hidden)
        for proj in ("query", "key", "value"):
            arrays[f"{b}/MultiHeadDotProductAttention_1/{proj}/kernel"] = r(hidden, heads, hd)
            arrays[f"{b}/MultiHeadDotProductAttention_1/{proj}/bias"] = r(heads, hd)
        arrays[f"{b}/MultiHeadDotProductAttention_1/out/kernel"] = r(heads, hd, hidden)
        arrays[f"{b}/MultiHeadDotProductAttention_1/out/bias"] = r(hidden)
        arrays[f"{b}/MlpBlock_3/Dense_0/kernel"], arrays[f"{b}/MlpBlock_3/Dense_0/bias"] = r(hidden, mlp), r(mlp)
        arrays[f"{b}/MlpBlock_3/Dense_1/kernel"], arrays[f"{b}/MlpBlock_3/Dense_1/bias"] = r(mlp, hidden), r(hidden)
    for key in drop:
        del arrays[key]
    np.savez(path, **arrays)
    return arrays


def test_vit_npz_loader(tmp_path):
    model = _tiny_vit(input_size=32, num_classes=5)  # 4x4 grid
    path = str(tmp_path / "ckpt.npz")
    arrays = _fake_npz(path, grid=6)  # checkpoint trained on a 6x6 grid
    head_before = [w.numpy().copy() for w in model.get_layer("head").weights]
    load_vit_npz(model, path)

    table = npz_table(model)
    assert len(table) == len(model.trainable_weights) - 2  # everything but the head
    for var, key, kind, heads in table:
        value, arr = var.numpy(), arrays[key]
        if kind == "pos":
            assert value.shape == (1, 1 + 4 * 4, 32)
            np.testing.assert_array_equal(value[:, 0], arr[:, 0])  # class-token row kept
            resized = tf.image.resize(arr[0, 1:].reshape(1, 6, 6, 32), (4, 4), method="bilinear")
            np.testing.assert_allclose(value[0, 1:], resized.numpy().reshape(16, 32), rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(value, arr.reshape(value.shape))
    for key in ("Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel",
                "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/out/kernel"):
        var = [v for v, k, _, _ in table if k == key][0]
        assert var.shape == (32, 32)
    attn = model.get_layer("Transformer_encoderblock_0_MultiHeadDotProductAttention_1")
    np.testing.assert_array_equal(  # head 1's query columns are npz[:, 1, :]
        attn.query_kernel.numpy()[:, 8:16],
        arrays["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"][:, 1, :])
    for before, w in zip(head_before, model.get_layer("head").weights):
        np.testing.assert_array_equal(before, w.numpy())
    assert np.isfinite(model(_images(32)).numpy()).all()

    # the same grid loads unchanged; .npz also works as a weights PATH
    same = str(tmp_path / "same.npz")
    arrays = _fake_npz(same, grid=4)
    model2 = _tiny_vit(input_size=32, num_classes=5, weights=same)
    np.testing.assert_array_equal(model2.get_layer("Transformer_posembed_input").pos_embedding.numpy(),
                                  arrays["Transformer/posembed_input/pos_embedding"])


def test_vit_npz_errors(tmp_path):
    model = _tiny_vit()
    key = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"
    path = str(tmp_path / "missing_key.npz")
    _fake_npz(path, grid=4, drop=(key,))
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(UserError) as err:
        load_vit_npz(model, path)
    assert key in str(err.value) and "\n" not in str(err.value)
    for a, w in zip(before, model.weights):  # all or nothing
        np.testing.assert_array_equal(a, w.numpy())
    wrong = str(tmp_path / "wide.npz")
    _fake_npz(wrong, grid=4, hidden=48, heads=4)
    with pytest.raises(UserError) as err:
        load_vit_npz(model, wrong)
    assert "embedding/kernel" in str(err.value)
    with pytest.raises(UserError):
        load_vit_npz(model, str(tmp_path / "absent.npz"))
    with pytest.raises(UserError):  # .npz weights only make sense for vit
        build_model("mobilenetv2", input_size=32, num_classes=3, weights=path)


def test_a_model_file_keras_cannot_rebuild_alone_says_the_route_that_trains_it(tmp_path):
    """A Lambda layer (or a custom one) loads only with code Keras' safe mode will not run from
    a file: the one line says the Python API and model.fit take the model itself."""
    import keras as keras3

    inputs = keras3.Input((8, 8, 3))
    x = keras3.layers.Lambda(lambda t: t * 2.0)(inputs)
    outputs = keras3.layers.Dense(3)(keras3.layers.GlobalAveragePooling2D()(x))
    path = str(tmp_path / "lambda.keras")
    keras3.Model(inputs, outputs).save(path)
    with pytest.raises(UserError, match=r"^cannot load Keras model .*lambda.keras: .*Lambda.*; "
                                        r"a model with custom layers or Lambda layers trains "
                                        r"from Python instead: .* model= to "
                                        r"elastictrainer.run, or use ElasticCallback") as err:
        build_model(path, num_classes=3)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("classes", [3, 12])
def test_user_model_with_another_class_count_gets_a_new_head(tmp_path, classes):
    """A saved 10-class model asked for K classes: a new K-way Dense replaces its output layer
    (one log line says so), every other weight is the saved one, the tensor count stays."""
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    user = keras.Model(inputs, outputs, name="mine")
    path = str(tmp_path / "ten.keras")
    user.save(path)
    logs = []
    model = build_model(path, num_classes=classes, log=logs.append)
    assert model.output_shape == (None, classes)
    assert len(logs) == 1 and "10-way" in logs[0] and f"{classes}-way" in logs[0]
    assert "ten.keras" in logs[0] and "\n" not in logs[0]
    assert [w.name for w in model.trainable_weights] == [w.name for w in user.trainable_weights]
    for a, b in zip(user.weights[:-2], model.weights[:-2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert model.get_layer("logits").kernel.shape == (4, classes)
    assert np.isfinite(model(_images(16)).numpy()).all()
    assert build_model(path, num_classes=10, log=logs.append).output_shape == (None, 10)
    assert len(logs) == 1  # same class count: nothing replaced, nothing said


def test_new_head_keeps_a_trailing_softmax_and_refuses_other_outputs(tmp_path):
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
    x = keras.layers.Dense(5, activation="relu", name="logits")(x)
    probs = keras.layers.Softmax(name="probs")(x)
    model = replace_head(keras.Model(inputs, probs), 2, log=lambda m: None)
    assert model.output_shape == (None, 2) and model.layers[-1].name == "probs"
    assert model.get_layer("logits").activation is keras.activations.relu
    np.testing.assert_allclose(model(_images(8)).numpy().sum(-1), 1, rtol=1e-5)
    conv_out = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(5, 3)(inputs))
    with pytest.raises(UserError) as err:
        replace_head(keras.Model(inputs, conv_out), 2, what="conv.keras")
    assert "conv.keras" in str(err.value) and "Dense" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fmt", ["weights.h5", "h5", "tf"])
def test_weights_of_another_class_count_load_all_but_the_classifier(tmp_path, fmt):
    src = build_model("smallcnn", input_size=16, num_classes=10)
    rng = np.random.default_rng(5)
    src.set_weights([rng.normal(size=w.shape).astype("float32") for w in src.weights])
    path = str(tmp_path / ("ckpt" if fmt == "tf" else f"w.{fmt}"))
    src.save_weights(path)
    fresh = build_model("smallcnn", input_size=16, num_classes=3)
    head_before = [w.numpy().copy() for w in fresh.get_layer("classifier").weights]
    logs = []
    dst = load_weights_file(fresh, path, log=logs.append)
    assert len(logs) == 1 and "everything but the classifier" in logs[0] and path in logs[0]
    for a, b in zip(src.get_layer("smallcnn").weights, dst.get_layer("smallcnn").weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for before, w in zip(head_before, dst.get_layer("classifier").weights):
        np.testing.assert_array_equal(before, w.numpy())
    # the same file into the same class count: a plain load, nothing said
    logs.clear()
    same = load_weights_file(build_model("smallcnn", input_size=16, num_classes=10), path,
                             log=logs.append)
    assert logs == []
    np.testing.assert_array_equal(same.get_layer("classifier").kernel.numpy(),
                                  src.get_layer("classifier").kernel.numpy())


@pytest.mark.parametrize("fmt", ["weights.h5", "h5", "tf"])
def test_weights_that_still_do_not_fit_are_one_line_and_change_nothing(tmp_path, fmt):
    other = build_model("smallcnn", input_size=16, num_classes=10)
    wide = build_model("mobilenetv2", input_size=32, num_classes=10)
    path = str(tmp_path / ("ckpt" if fmt == "tf" else f"w.{fmt}"))
    other.save_weights(path)
    before = [w.numpy().copy() for w in wide.weights]
    with pytest.raises(UserError) as err:
        load_weights_file(wide, path, log=lambda m: pytest.fail(m))
    assert path in str(err.value) and "\n" not in str(err.value)
    for a, w in zip(before, wide.weights):
        np.testing.assert_array_equal(a, w.numpy())
