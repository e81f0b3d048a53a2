"""Vision Transformer (ViT-B/16 by default) in tf_keras, laid out for the published .npz checkpoints.

Model: Input [0, 255] -> augment_flip/augment_rotation -> preprocess ([-1, 1]) -> "embedding"
Conv2D(patch, stride patch) -> "patch_sequence" reshape -> "cls" class token -> position embedding
-> `depth` pre-norm transformer blocks -> "Transformer_encoder_norm" -> "class_token" -> "head".

Keras layer names are the checkpoint key paths with "/" replaced by "_" (keras forbids "/"):

    npz key                                                  keras layer             .attribute
    embedding/{kernel,bias}                                  embedding               .kernel/.bias
    cls                                                      cls                     .cls
    Transformer/posembed_input/pos_embedding                 Transformer_posembed_input .pos_embedding
    Transformer/encoderblock_{i}/LayerNorm_0/{scale,bias}    Transformer_encoderblock_{i}_LayerNorm_0 .gamma/.beta
    Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/{query,key,value,out}/{kernel,bias}
                                                             Transformer_encoderblock_{i}_MultiHeadDotProductAttention_1
                                                                                     .{query,key,value,out}_{kernel,bias}
    Transformer/encoderblock_{i}/LayerNorm_2/{scale,bias}    Transformer_encoderblock_{i}_LayerNorm_2 .gamma/.beta
    Transformer/encoderblock_{i}/MlpBlock_3/Dense_{0,1}/{kernel,bias}
                                                             Transformer_encoderblock_{i}_MlpBlock_3_Dense_{0,1}
    Transformer/encoder_norm/{scale,bias}                    Transformer_encoder_norm .gamma/.beta
    head/*, pre_logits/*                                     not loaded (our "head" is a new classifier)

Attention weights are stored 2-D in keras so that attention is plain MatMul ops; the checkpoint's
per-head arrays map by a reshape (heads-major, i.e. column h*head_dim + d is head h, channel d):

    query/key/value kernel  npz (hidden, heads, head_dim) -> keras (hidden, heads*head_dim)
    query/key/value bias    npz (heads, head_dim)         -> keras (heads*head_dim,)
    out kernel              npz (heads, head_dim, hidden) -> keras (heads*head_dim, hidden)
    out bias                npz (hidden,)                 -> keras (hidden,)

The position embedding of a checkpoint trained at another resolution is resized bilinearly on its
patch grid (the class-token row is kept as is). The MLP uses exact (erf) GELU; the published flax
models use the tanh approximation, which differs by < 1e-3 and does not matter for fine-tuning.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import math
import os

import numpy as np
import tensorflow as tf
import tf_keras as keras

from elastictrainer.flavors import compat
from elastictrainer.errors import UserError, one_line
from elastictrainer.models import DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES
from elastictrainer.models.base import (
    augment, check_input_size, check_num_classes, fetch_pretrained, image_input,
    register_serializable, scale_to_unit_range, weights_kind,
)

# The checkpoint vit-keras downloaded for vit_b16(pretrained=True): ImageNet-21k pre-trained,
# ImageNet-2012 fine-tuned at 384x384 (24x24 patch grid), mirrored from google-research/vision_transformer.
VIT_B16_NPZ = "ViT-B_16_imagenet21k+imagenet2012.npz"
VIT_B16_URL = "https://github.com/faustomorales/vit-keras/releases/download/dl/" + VIT_B16_NPZ

VIT_B16 = dict(patch_size=16, hidden=768, depth=12, heads=12, mlp_dim=3072, dropout=0.1)

POS_LAYER = "Transformer_posembed_input"


class _NamedBuild:
    """Keep weight names "<layer>/<weight>" when keras builds the layer from a saved config."""

    def build_from_config(self, config):
        with tf.name_scope(compat.layer_name_scope(self)):
            super().build_from_config(config)


# ----------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------

@register_serializable
class ClassToken(_NamedBuild, keras.layers.Layer):
    """Prepends a learned token (weight `cls`, shape (1, 1, hidden), zeros init) to the sequence."""

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, int(input_shape[-1])),
                                   initializer="zeros", trainable=True)
        super().build(input_shape)

    def call(self, inputs):
        token = tf.cast(self.cls, inputs.dtype)
        token = tf.tile(token, [tf.shape(inputs)[0], 1, 1])
        return tf.concat([token, inputs], axis=1)

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape).as_list()
        return tf.TensorShape([shape[0], None if shape[1] is None else shape[1] + 1, shape[2]])


@register_serializable
class AddPositionEmbedding(_NamedBuild, keras.layers.Layer):
    """Adds a learned position embedding (weight `pos_embedding`, shape (1, tokens, hidden))."""

    def build(self, input_shape):
        self.pos_embedding = self.add_weight(
            name="pos_embedding", shape=(1, int(input_shape[1]), int(input_shape[2])),
            initializer=keras.initializers.RandomNormal(stddev=0.02), trainable=True)
        super().build(input_shape)

    def call(self, inputs):
        return inputs + tf.cast(self.pos_embedding, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


@register_serializable
class MultiHeadDotProductAttention(_NamedBuild, keras.layers.Layer):
    """Multi-head self-attention with plain MatMul/Softmax ops (stable op names, 8 weights).

    Weights (in this order): query_kernel, query_bias, key_kernel, key_bias, value_kernel,
    value_bias, out_kernel, out_bias; kernels are 2-D (see the module docstring for the layout).
    """

    def __init__(self, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)

    def build(self, input_shape):
        hidden = int(input_shape[-1])
        if hidden % self.num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {self.num_heads} heads")
        self.hidden = hidden
        self.head_dim = hidden // self.num_heads
        for proj in ("query", "key", "value", "out"):
            kernel = self.add_weight(name=f"{proj}_kernel", shape=(hidden, hidden),
                                     initializer="glorot_uniform", trainable=True)
            bias = self.add_weight(name=f"{proj}_bias", shape=(hidden,), initializer="zeros", trainable=True)
            setattr(self, f"{proj}_kernel", kernel)
            setattr(self, f"{proj}_bias", bias)
        super().build(input_shape)

    def call(self, inputs):
        batch, tokens = tf.shape(inputs)[0], tf.shape(inputs)[1]
        flat = tf.reshape(inputs, [-1, self.hidden])

        def heads(proj):  # (batch*tokens, hidden) -> (batch, heads, tokens, head_dim)
            y = tf.nn.bias_add(tf.matmul(flat, getattr(self, f"{proj}_kernel")), getattr(self, f"{proj}_bias"))
            y = tf.reshape(y, [batch, tokens, self.num_heads, self.head_dim])
            return tf.transpose(y, [0, 2, 1, 3])

        q, k, v = heads("query"), heads("key"), heads("value")
        scores = tf.matmul(q, k, transpose_b=True) * tf.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        attn = tf.nn.softmax(scores, axis=-1)
        context = tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3])  # (batch, tokens, heads, head_dim)
        context = tf.reshape(context, [-1, self.hidden])
        out = tf.nn.bias_add(tf.matmul(context, self.out_kernel), self.out_bias)
        return tf.reshape(out, [batch, tokens, self.hidden])

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads}


@register_serializable
class TakeClassToken(keras.layers.Layer):
    """(batch, tokens, hidden) -> (batch, hidden): the class token's features."""

    def call(self, inputs):
        return inputs[:, 0]

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape).as_list()
        return tf.TensorShape([shape[0], shape[2]])


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------

def _block(x, i, heads, mlp_dim, dropout):
    p = f"Transformer_encoderblock_{i}"
    hidden = x.shape[-1]
    y = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{p}_LayerNorm_0")(x)
    y = MultiHeadDotProductAttention(heads, name=f"{p}_MultiHeadDotProductAttention_1")(y)
    y = keras.layers.Dropout(dropout, name=f"{p}_dropout_attention")(y)
    x = keras.layers.Add(name=f"{p}_add_attention")([x, y])
    y = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{p}_LayerNorm_2")(x)
    y = keras.layers.Dense(mlp_dim, activation="gelu", name=f"{p}_MlpBlock_3_Dense_0")(y)
    y = keras.layers.Dropout(dropout, name=f"{p}_MlpBlock_3_dropout_0")(y)
    y = keras.layers.Dense(hidden, name=f"{p}_MlpBlock_3_Dense_1")(y)
    y = keras.layers.Dropout(dropout, name=f"{p}_MlpBlock_3_dropout_1")(y)
    return keras.layers.Add(name=f"{p}_add_mlp")([x, y])


def build_vit(input_size=DEFAULT_INPUT_SIZE, num_classes=DEFAULT_NUM_CLASSES, patch_size=16, hidden=768,
              depth=12, heads=12, mlp_dim=3072, dropout=0.1, weights="none", name="vit"):
    """A ViT classifier; defaults are ViT-B/16. Small values give a tiny ViT (tests)."""
    check_input_size(input_size, minimum=patch_size, multiple_of=patch_size, model=f"vit (patch {patch_size})")
    check_num_classes(num_classes)
    if hidden % heads:
        raise UserError(f"vit hidden size {hidden} must be divisible by the number of heads {heads}")
    if weights_kind(weights) != "none":
        raise UserError("build_vit builds random weights; load ImageNet ones with vit_b16 or a "
                        "PATH with models.build.load_weights")
    grid = input_size // patch_size

    inputs = image_input(input_size)
    x = augment(inputs)
    x = scale_to_unit_range(x)
    x = keras.layers.Conv2D(hidden, patch_size, strides=patch_size, padding="valid", name="embedding")(x)
    x = keras.layers.Reshape((grid * grid, hidden), name="patch_sequence")(x)
    x = ClassToken(name="cls")(x)
    x = AddPositionEmbedding(name=POS_LAYER)(x)
    x = keras.layers.Dropout(dropout, name="Transformer_posembed_dropout")(x)
    for i in range(depth):
        x = _block(x, i, heads, mlp_dim, dropout)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="Transformer_encoder_norm")(x)
    x = TakeClassToken(name="class_token")(x)
    outputs = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(inputs, outputs, name=name)


def vit_b16(input_size=DEFAULT_INPUT_SIZE, num_classes=DEFAULT_NUM_CLASSES, weights="none"):
    """ViT-B/16; weights "imagenet" = the ImageNet-21k + ImageNet-2012 checkpoint (.npz, keras
    cache), "none" = random."""
    npz = None
    if weights_kind(weights) == "imagenet":  # fetch first: fail fast before building 86M parameters
        npz = fetch_pretrained(VIT_B16_NPZ, VIT_B16_URL, "vit")
    model = build_vit(input_size, num_classes, name="vit_b16", **VIT_B16)
    if npz is not None:
        load_vit_npz(model, npz)
    return model


# ----------------------------------------------------------------------------------------------
# .npz checkpoints
# ----------------------------------------------------------------------------------------------

def is_vit(model):
    names = {layer.name for layer in model.layers}
    return POS_LAYER in names and "embedding" in names


def _depth(model):
    names = {layer.name for layer in model.layers}
    depth = 0
    while f"Transformer_encoderblock_{depth}_LayerNorm_0" in names:
        depth += 1
    return depth


def npz_table(model):
    """[(keras variable, npz key, kind, heads)] for every weight the checkpoint provides (no head).

    kind: "same" (identical shape), "qkv_kernel", "qkv_bias", "out_kernel" (reshapes, see module
    docstring; `heads` is the layer's head count) or "pos" (position embedding, resized on the
    patch grid when needed).
    """
    get = model.get_layer
    rows = [
        (get("embedding").kernel, "embedding/kernel", "same", None),
        (get("embedding").bias, "embedding/bias", "same", None),
        (get("cls").cls, "cls", "same", None),
        (get(POS_LAYER).pos_embedding, "Transformer/posembed_input/pos_embedding", "pos", None),
    ]

    def norm(layer_name, key):
        layer = get(layer_name)
        return [(layer.gamma, f"{key}/scale", "same", None), (layer.beta, f"{key}/bias", "same", None)]

    def dense(layer_name, key):
        layer = get(layer_name)
        return [(layer.kernel, f"{key}/kernel", "same", None), (layer.bias, f"{key}/bias", "same", None)]

    for i in range(_depth(model)):
        p, k = f"Transformer_encoderblock_{i}", f"Transformer/encoderblock_{i}"
        rows += norm(f"{p}_LayerNorm_0", f"{k}/LayerNorm_0")
        attn = get(f"{p}_MultiHeadDotProductAttention_1")
        for proj in ("query", "key", "value", "out"):
            key = f"{k}/MultiHeadDotProductAttention_1/{proj}"
            rows.append((getattr(attn, f"{proj}_kernel"), f"{key}/kernel",
                         "out_kernel" if proj == "out" else "qkv_kernel", attn.num_heads))
            rows.append((getattr(attn, f"{proj}_bias"), f"{key}/bias",
                         "same" if proj == "out" else "qkv_bias", attn.num_heads))
        rows += norm(f"{p}_LayerNorm_2", f"{k}/LayerNorm_2")
        rows += dense(f"{p}_MlpBlock_3_Dense_0", f"{k}/MlpBlock_3/Dense_0")
        rows += dense(f"{p}_MlpBlock_3_Dense_1", f"{k}/MlpBlock_3/Dense_1")
    rows += norm("Transformer_encoder_norm", "Transformer/encoder_norm")
    return rows


def resize_pos_embedding(pos, tokens):
    """(1, 1 + g*g, hidden) -> (1, tokens, hidden): bilinear resize of the grid part, class row kept."""
    if pos.shape[1] == tokens:
        return pos
    hidden = pos.shape[2]
    old, new = math.isqrt(pos.shape[1] - 1), math.isqrt(tokens - 1)
    if old * old != pos.shape[1] - 1 or new * new != tokens - 1:
        raise ValueError(f"position embedding grid is not square ({pos.shape[1]} -> {tokens} tokens)")
    grid = pos[0, 1:].reshape(1, old, old, hidden).astype(np.float32)
    grid = tf.image.resize(grid, (new, new), method="bilinear").numpy().reshape(1, new * new, hidden)
    return np.concatenate([pos[:, :1], grid.astype(pos.dtype)], axis=1)


def _convert(arr, var, kind, heads):
    target = tuple(var.shape)
    if kind == "pos":
        if arr.ndim != 3 or arr.shape[0] != 1 or arr.shape[2] != target[2]:
            raise ValueError(f"shape {arr.shape} does not fit {target}")
        return resize_pos_embedding(arr, target[1])
    if kind == "qkv_kernel":
        expected = (target[0], heads, target[1] // heads)
    elif kind == "qkv_bias":
        expected = (heads, target[0] // heads)
    elif kind == "out_kernel":
        expected = (heads, target[0] // heads, target[1])
    else:
        expected = target
    if tuple(arr.shape) != expected:
        raise ValueError(f"shape {tuple(arr.shape)}, model expects {expected}")
    return arr.reshape(target)


def load_vit_npz(model, path):
    """Load a published-layout ViT .npz into `model` (all or nothing); UserError on any problem."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UserError(f"ViT checkpoint not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:
        raise UserError(f"cannot read ViT checkpoint {path}: {one_line(e)}") from e
    pairs = []
    for var, key, kind, heads in npz_table(model):
        if key not in arrays:
            raise UserError(f"ViT checkpoint {path} lacks key {key!r} (not the published ViT layout?)")
        try:
            value = _convert(np.asarray(arrays[key]), var, kind, heads)
        except ValueError as e:
            raise UserError(f"ViT checkpoint {path}: key {key!r} does not fit the model: {one_line(e)}") from e
        pairs.append((var, value.astype(var.dtype.as_numpy_dtype)))
    keras.backend.batch_set_value(pairs)
    return model
