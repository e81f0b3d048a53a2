"""Tensor roles: what each trainable tensor is (head, norm, bias, kernel), from the model's
layers, so that schemes (schemes.py) declare what they train as rules over roles."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

from elastictrainer import flavors
from elastictrainer.method.schemes import ROLES


def tensor_roles(model):
    """Role of each trainable tensor (model.trainable_weights order): 'head' (the output
    layer's), 'norm' (normalisation scale/offset), 'bias', or 'kernel' (everything else)."""
    flavor = flavors.for_model(model)
    owner = {}
    for layer in flavor.layers(model):
        for w in flavor.own_trainable_weights(layer):
            owner.setdefault(id(w), layer)
    head = None
    if getattr(model, "outputs", None):
        made = flavor.made_by(model.outputs[0])
        head = made[0] if made else None
    if head is None or not head.trainable_weights:
        head = next((layer for layer in reversed(model.layers) if layer.trainable_weights), None)
    head_ids = {id(w) for w in head.trainable_weights} if head is not None else set()
    norm_types = flavor.norm_layer_types()
    roles = []
    for w in model.trainable_weights:
        layer = owner.get(id(w))
        short = flavor.variable_name(w).split("/")[-1].split(":")[0]
        if id(w) in head_ids:
            roles.append("head")
        elif isinstance(layer, norm_types) or short in ("gamma", "beta", "scale"):
            roles.append("norm")
        elif short == "bias" or short.endswith("_bias"):
            roles.append("bias")
        else:
            roles.append("kernel")
    return roles


def check_roles(roles):
    """Every tensor covered by exactly one known role (big_vision's habit of checking that every
    parameter is covered by a rule)."""
    unknown = sorted({r for r in roles if r not in ROLES})
    if unknown:
        raise ValueError(f"tensor roles {unknown} are not in schemes.ROLES {ROLES}")
    return roles
