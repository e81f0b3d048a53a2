"""Build a model by name (models.MODELS) or load a user's saved Keras model; load weight files;
give a saved model a new classifier for another class count.

    model = build_model(name_or_path, input_size=224, num_classes=200, weights="none")
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import os


from elastictrainer import flavors
from elastictrainer.errors import UserError, one_line
from elastictrainer.models import DEFAULT_INPUT_SIZE, DEFAULT_NUM_CLASSES, MODELS, is_user_model
from elastictrainer.models import efficientnet, vit
from elastictrainer.models.base import build_builtin, load_weights_file, output_head, weights_kind


def build_model(name_or_path, input_size=None, num_classes=None, weights="none", log=print,
                progress=True):
    """Build a built-in model by name, or load a user's saved .keras/.h5 model.

    input_size / num_classes default to 224 / 200 for built-in models. For a user model the
    input size comes from the file (input_size is ignored), and a num_classes that is given and
    differs from the model's output units replaces its output layer by a new classifier (see
    replace_head). For a user model "none"/"imagenet" keep the saved weights and a PATH loads
    weights on top.  weights "synthetic" (smallcnn, mobilenetv2): the backbone pretrained on
    a synthetic source task, made once and cached (models/pretrain.py; `log` and `progress`
    report that).  `log` also gets the one-line notes on replaced or skipped classifiers.
    """
    name = os.fspath(name_or_path)
    kind = weights_kind(weights)
    if is_user_model(name):
        if kind == "synthetic":
            raise UserError(f"--weights synthetic pretrains a built-in model ({', '.join(synthetic_models())}); "
                            f"{name} brings its own weights (--weights none keeps them, or pass a PATH)")
        return _load_user_model(name, num_classes, weights, log)
    key = name.strip().lower()
    spec = MODELS.get_or_fail(key)
    if kind == "synthetic" and not spec.synthetic:
        raise UserError(f"{key} has no synthetic pretraining (only {', '.join(synthetic_models())} "
                        f"have); use --weights imagenet or --weights PATH")
    model = build_builtin(key, DEFAULT_INPUT_SIZE if input_size is None else input_size,
                          DEFAULT_NUM_CLASSES if num_classes is None else num_classes,
                          "none" if kind in ("path", "synthetic") else weights)
    if kind == "path":
        load_weights(model, weights, log)
    elif kind == "synthetic":
        # after building, so the new classifier is drawn from the caller's random state whether
        # or not pretraining (which seeds its own) runs now
        from elastictrainer.models import pretrain
        pretrain.load_synthetic(model, key, int(model.input_shape[1]), log=log, progress=progress)
    return model


def synthetic_models():
    return tuple(name for name, spec in MODELS.items() if spec.synthetic)


def build_sized(name_or_path, input_size=None, num_classes=None, weights="none", log=print,
                progress=True):
    """build_model, returning (model, input_size, num_classes) as the model really has them:
    a saved model brings its own input size, which callers need for table paths and data."""
    model = build_model(name_or_path, input_size=input_size, num_classes=num_classes,
                        weights=weights, log=log, progress=progress)
    return model, int(model.input_shape[1]), int(model.output_shape[-1])


def load_weights(model, path, log=print):
    """Weights from a PATH: a published-layout ViT .npz, EfficientNet-Lite0's legacy PyTorch
    .pth, or what `model.save_weights` wrote
    (everything but the classifier when that has another shape; `log` says so)."""
    path = os.path.expanduser(os.fspath(path))
    if path.lower().endswith(".npz"):
        if not vit.is_vit(model):
            raise UserError(f"{path}: .npz weights are only supported for the vit model, "
                            f"not {model.name}")
        vit.load_vit_npz(model, path)
        return model
    if path.lower().endswith(".pth"):
        if not efficientnet.is_efficientnet_lite0(model):
            raise UserError(f"{path}: .pth weights are only supported for efficientnet_lite0, "
                            f"not {model.name}")
        efficientnet.load_torch_weights(model, path, int(model.output_shape[-1]))
        log(f"weights {path}: EfficientNet-Lite0's from a PyTorch file")
        return model
    return load_weights_file(model, path, log)


def replace_head(model, num_classes, what=None, log=print):
    """`model` with its output Dense layer replaced by a new `num_classes`-way one (same
    configuration, fresh values; weightless layers after it, e.g. a Softmax, are kept), sharing
    every other layer.  UserError when the output is not made by a Dense layer."""
    what = what or model.name
    head = output_head(model)
    if head is None:
        raise UserError(f"{what} outputs {model.output_shape[-1]} classes and {num_classes} were "
                        f"asked for, but its output is not made by a Dense layer that could be "
                        f"replaced; save it with {num_classes} outputs")
    dense, features, after = head
    config = dict(dense.get_config(), units=int(num_classes))
    x = type(dense).from_config(config)(features)
    for layer in after:
        x = layer(x)
    new = flavors.for_model(model).functional_model(model.inputs, x, name=model.name)
    log(f"{what}: replaced its {dense.units}-way output layer '{dense.name}' by a new "
        f"{num_classes}-way classifier (fresh values) for {num_classes} classes")
    return new


# what Keras' load errors say of a layer it cannot rebuild from the file alone
CUSTOM_OBJECT_WORDS = ("safe_mode", "custom_objects", "Could not locate", "Unknown layer",
                       "register_keras_serializable", "Lambda")


def _load_user_model(path, num_classes, weights, log):
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise UserError(f"model file not found: {path}")
    flavor = flavors.for_file(path)  # the Keras that saved it loads it
    try:
        model = flavor.load_model(path)
    except Exception as e:
        said = one_line(e, limit=300)
        # Keras' own advice (safe_mode, custom_objects) is for its Python API: say the route
        hint = ("; a model with custom layers or Lambda layers trains from Python instead: "
                "build it in your code and pass it as model= to elastictrainer.run, or use "
                "ElasticCallback in model.fit"
                if any(k in said for k in CUSTOM_OBJECT_WORDS) else "")
        raise UserError(f"cannot load Keras model {path}: {said}{hint}") from e
    if not flavor.is_model(model) or len(model.outputs or []) != 1:
        raise UserError(f"{path}: expected a Keras model with one output")
    units = model.output_shape[-1]
    if num_classes is not None and units != num_classes:
        model = replace_head(model, num_classes, path, log)
    if weights_kind(weights) == "path":
        load_weights(model, weights, log)
    return model
