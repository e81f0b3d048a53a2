"""Private layer API of both Kerases: the weights a layer made itself, the calls that built a
functional model, a layer's name scope and random generator, and a call argument forced on every
call of a layer.

Keras 3 layers (flavors/keras3.py)
    keras3_own_trainable_variables (`Layer._trainable_variables`): the trainable variables a
        layer made itself (roles.py); `trainable_variables` includes its sublayers'.
    keras3_flatten_layers (`Layer._flatten_layers()`): every layer of a model, nested ones
        included, once each; `model.layers` lists the top level only.
    keras_history and layer_input_tensors (below) read Keras 3's tensors and nodes as well.
    keras3_node_call (`KerasTensor._keras_history`, `Operation._inbound_nodes`, a node's
        `arguments`): the layer call that made a tensor of a Keras 3 functional model, with
        its arguments, input and output tensors (prefix/graph.py flattens the model into
        these calls).  Keras 3 has no public accessor for a model's nodes.

tf-keras layers and the functional graph
    keras_history (`KerasTensor._keras_history`): the layer (and its call) that made a
        functional model's tensor (roles.py, models/base.py).  No public accessor.
    tf_keras_node_call (`KerasTensor._keras_history`, the node's `call_args`, `call_kwargs`,
        `keras_inputs`): the layer call that made a tensor of a tf-keras functional model, as
        prefix/graph.py flattens the model.  No public accessor.
    layer_input_tensors (`Layer._inbound_nodes[i].input_tensors`): the tensors a layer's
        i-th call took (models/base.py).  Public `Layer.get_input_at(i)` returns the same
        tensors, one input unwrapped from its list; it could replace this one.
    own_trainable_weights (`Layer._trainable_weights`): the trainable weights a layer made
        itself, not its sublayers' (roles.py); `trainable_weights` includes the sublayers'.
    layer_name_scope (`Layer._name_scope()`): the name scope a layer builds its weights in,
        so that a layer built from a saved config names them as when built by a call
        (models/vit.py).  No public accessor.
    is_random_layer (`Layer._random_generator`): whether a layer draws random numbers (tf-keras
        gives every augmentation, dropout and noise layer one; prefix/graph.py keeps such layers
        out of a cached prefix).  No public base class or flag says so.
    layer_random_generator (`Layer._random_generator._generator`): the tf.random.Generator
        of a random (augmentation) layer, whose state a run saves and restores
        (runs/setup.py, through flavors/tf_keras.py).  Public `keras.utils.set_random_seed`
        reseeds, but cannot read a generator's state or put it back.

Layer calls (flavors/batchnorm.py)
    force_call_argument, release_call_argument (an instance's own `call`): --bn_mode inference
        makes every call of a BatchNorm layer run with training=False, whatever its caller
        passes, nested models and FlatGraph's sub-models included.  Both Kerases' `__call__`
        fill `training` in and then look `call` up on the instance at each call, so a
        function stored on the instance takes the last word; neither documents that.  The
        public alternatives change what a run must not: `trainable = False` (selection is by
        var_list, and trainable_weights must stay as the optimizer was built), or a new model
        (the user's layers and their compiled functions).
"""

# -- Keras 3 layers ---------------------------------------------------------------------------

def keras3_own_trainable_variables(layer):
    """The trainable variables a Keras 3 layer created itself (not its sublayers')."""
    return [v for v in getattr(layer, "_trainable_variables", []) if v.trainable]


def keras3_flatten_layers(model):
    """Every layer of a Keras 3 model (itself included), nested ones too, once each."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def keras3_node_call(tensor):
    """(layer, node, call_args, call_kwargs, input_tensors, output_tensors, is_input) of the
    call that made a Keras 3 functional model's KerasTensor: its `_keras_history` names the
    operation and the index of its call (`_inbound_nodes`), whose node keeps the arguments it
    was called with (`arguments`: SymbolicArguments) and the KerasTensors it made."""
    operation, index = tensor._keras_history[:2]
    node = operation._inbound_nodes[index]
    arguments = node.arguments
    return (operation, node, arguments.args, dict(arguments.kwargs),
            list(arguments.keras_tensors), list(node.outputs), node.is_input)


# -- tf-keras layers --------------------------------------------------------------------------

def keras_history(tensor):
    """(layer, node_index, tensor_index) of the call that made a functional model's tensor, or
    None for a tensor no Keras layer made (tf-keras names the layer `layer`, Keras 3
    `operation`: index it)."""
    return getattr(tensor, "_keras_history", None)


def tf_keras_node_call(tensor):
    """(layer, node, call_args, call_kwargs, input_tensors, output_tensors, is_input) of the
    call that made a tf-keras functional model's KerasTensor (keras_history, then the layer's
    node of that call and what it records of the call)."""
    import tensorflow as tf

    layer, index = tensor._keras_history[:2]
    node = layer.inbound_nodes[index]
    return (layer, node, node.call_args, dict(node.call_kwargs), list(node.keras_inputs),
            tf.nest.flatten(node.outputs), node.is_input)


def layer_input_tensors(layer, node_index):
    """The input tensors (as the layer was called with them: one, or a structure) of `layer`'s
    call `node_index`."""
    return layer._inbound_nodes[node_index].input_tensors


def own_trainable_weights(layer):
    """The trainable weights `layer` created itself (not its sublayers'); [] for an object that
    is not a Keras layer."""
    return getattr(layer, "_trainable_weights", [])


def layer_name_scope(layer):
    """The name scope `layer` creates its weights in ("<outer scopes>/<layer name>/")."""
    return layer._name_scope()


def is_random_layer(layer):
    """Whether `layer` draws random numbers when it runs in training mode."""
    return getattr(layer, "_random_generator", None) is not None


def layer_random_generator(layer):
    """The tf.random.Generator of a random layer (augmentation, dropout with a generator), or
    None."""
    return getattr(getattr(layer, "_random_generator", None), "_generator", None)


# -- layer calls ------------------------------------------------------------------------------

def force_call_argument(layer, name, value):
    """Make every later call of `layer` run its `call` with argument `name` set to `value`,
    whatever its caller or the call context passes; False when its `call` takes no such
    argument (nothing changed).  Functions traced before keep what they traced."""
    import functools
    import inspect

    original = layer.call
    signature = inspect.signature(original)
    if name not in signature.parameters:
        return False

    @functools.wraps(original)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # the argument may come by position
        bound.arguments[name] = value
        return original(*bound.args, **bound.kwargs)

    call.replaced_call = vars(layer).get("call")  # one stored on the instance before, if any
    layer.call = call
    return True


def release_call_argument(layer):
    """Undo force_call_argument: `layer` calls what it called before."""
    call = vars(layer).get("call")
    if call is None or not hasattr(call, "replaced_call"):
        return
    if call.replaced_call is None:
        del layer.call
    else:
        layer.call = call.replaced_call
