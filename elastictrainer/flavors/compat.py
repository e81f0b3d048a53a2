"""Every use of private TensorFlow, tf-keras and TensorBoard API in the package, one small
function each; no other module reaches past their public API (tests/integration/test_compat.py
checks).

Checked against TensorFlow 2.16 with tf-keras 2.16 and TensorFlow 2.21 with tf-keras 2.21
(flavors/tf_keras.py's TESTED_TF_KERAS; tests/integration/test_compat.py calls every function
here on both).  Importing this module imports nothing from TensorFlow: what needs it imports it
inside the function, so modules that load without TensorFlow (runlog, which plotting imports;
profiler.trace) can import it.

tf-keras optimizer (tf_keras.optimizers.Optimizer; flavors/tf_keras.py)
    OPTIMIZER_PRIVATE_API, missing_optimizer_api, compute_current_learning_rate, clip_gradients,
    deduplicate_sparse_grad, use_weight_decay, var_key, update_step, update_step_xla:
        the steps `apply_gradients` runs inside tf.distribute's merge_call.  The public path
        goes through that merge_call, which keeps every graph it was traced in alive (one per
        tensor selection here; flavors/optimizers.apply_updates measures it), and the public
        API has no way to run those steps without it.
    is_dtensor_optimizer (`_mesh`, `_run_with_dtensor`): the public API does not say whether an
        optimizer runs under DTensor, whose update path flavors/optimizers.apply_updates does
        not cover.
    has_adam_slots, adam_slots (`_index_dict`, `_momentums`, `_velocities`,
        `_velocity_hats`): Adam's moments of one variable, for the per-tensor bias
        correction (flavors/tf_keras.py's _adam_update).  `optimizer.variables` lists them,
        but only by name and position, which is not an interface either.

Keras 3 optimizer (keras.optimizers.Optimizer, TensorFlow backend; flavors/keras3.py)
    KERAS3_OPTIMIZER_PRIVATE_API, keras3_missing_optimizer_api, keras3_var_key, keras3_knows,
    keras3_clip_gradients, keras3_use_weight_decay: the steps `apply` runs around the public
        `update_step`, which it runs inside tf.distribute's merge_call (that keeps every graph
        it was traced in alive, one per tensor selection here); the public API has no way to
        run them without it.
    keras3_adam_slots (`_momentums`, `_velocities`, `_velocity_hats`, `_get_variable_index`):
        Adam's moments of one variable, for the per-tensor bias correction.

Keras 3 layers (flavors/keras3.py)
    keras3_own_trainable_variables (`Layer._trainable_variables`): the trainable variables a
        layer made itself (roles.py); `trainable_variables` includes its sublayers'.
    keras3_flatten_layers (`Layer._flatten_layers()`): every layer of a model, nested ones
        included, once each; `model.layers` lists the top level only.
    keras3_loss_tracker (`Model._loss_tracker`): the mean of the loss that model.fit reports
        as "loss"; Keras 3's train_step updates it itself, `compute_loss` does not (tf-keras's
        compute_loss updates its own).  ElasticCallback's steps (fit/steps.py) do what train_step
        does.
    keras3_unscale_loss_for_replicas (`keras.src.losses.loss.unscale_loss_for_distribution`):
        Keras 3 (from 3.4 on) divides each replica's loss by the replicas in sync, and its
        train_step logs the loss multiplied back; keras3_scales_loss_for_replicas says whether
        this Keras does (3.3 does not: its replicas' gradients are then averaged).  No public
        accessor for either.
    keras_history and layer_input_tensors (below) read Keras 3's tensors and nodes as well.
    keras3_node_call (`KerasTensor._keras_history`, `Operation._inbound_nodes`, a node's
        `arguments`): the layer call that made a tensor of a Keras 3 functional model, with
        its arguments, input and output tensors (prefix/graph.py flattens the model into
        these calls).  Keras 3 has no public accessor for a model's nodes.

tf.function
    concrete_functions (`_list_all_concrete_functions`): the graphs a tf.function has traced
        so far, for their size (train/compiled.graph_bytes) and whether a call would trace
        (train/steps.ProbeStep.traced).  `experimental_get_tracing_count` counts traces but gives no
        graph, and `get_concrete_function` needs a signature and traces when it has none.

AutoGraph (tf_setup.py)
    autograph_do_not_convert (`tensorflow.python.autograph.core.config`, a rule's `_prefix`):
        tells AutoGraph to leave a module's code unconverted.  TensorFlow 2.21's rules already
        skip tf_keras; 2.16's name only `keras`, so it transpiles all of tf_keras for every
        traced step (tf_setup.py has the timings).  `tf.autograph.experimental.do_not_convert`
        marks single functions only, and `autograph=False` would stop converting users' own
        layers too.

Profiler (profiler/trace.py)
    xplane_pb2 (`tensorflow.tsl.profiler.protobuf.xplane_pb2`): the protobuf of the
        .xplane.pb that tf.profiler writes.  TensorFlow exports no reader; the profile
        plugin's op tables stop at 500 rows.

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
    steps_per_execution (`Model._steps_per_execution`): the batches a tf-keras model.fit
        train function call runs (compile's steps_per_execution); ElasticCallback times and
        selects every step, so it needs 1.  No public accessor (Keras 3 has one).
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

model.fit's callbacks and train function (fit/callback.py)
    answer_tf_keras_batch_hooks (`Callback._supports_tf_logs`,
        `Callback._implements_{train,test,predict}_batch_hooks`): tf-keras' CallbackList asks
        every callback these before fit starts, and ElasticCallback is a Keras 3 callback
        (Keras 3 asks nothing of the kind), so it must answer them to run in a tf-keras fit.
        tf-keras has no public way to say which hooks a callback implements.
    replace_train_function, restore_train_function (`Model.train_function`, tf-keras'
        `Model.train_tf_function`): model.fit calls `train_function(iterator)` for each batch;
        ElasticCallback runs the step its runtime asks for instead (a probe, a timed full
        step, a selection's step).  Neither Keras has a public hook that replaces the step a
        batch runs; a custom train_step would be one compiled function for every selection.
        tf-keras' TensorBoard callback draws the graph of `train_tf_function`, which is then
        never traced: a plain function there makes it skip the drawing.

TensorBoard (runlog.py)
    tensorboard_without_tensorflow (module `tensorboard.compat.notf`): TensorBoard reads event
        files through its own TensorFlow stub when that module imports, so that plotting
        does not start TensorFlow.  TensorBoard has no public switch for it.
    load_events, tensor_event_array (`tensorboard.backend.event_processing.event_accumulator`,
        `tensorboard.util.tensor_util`): the scalars and tensors of a run's event files.
        TensorBoard has no public reader of event files, and TensorFlow's
        (tf.compat.v1.train.summary_iterator, tf.make_ndarray) would start TensorFlow in
        plotting.
"""
import sys
import types

# -- tf-keras optimizer -----------------------------------------------------------------------

# What flavors/optimizers.apply_updates calls on a tf_keras.optimizers.Optimizer (legacy and Keras 3
# optimizers lack some of them).
OPTIMIZER_PRIVATE_API = ("_compute_current_learning_rate", "_clip_gradients",
                         "_deduplicate_sparse_grad", "_use_weight_decay", "_update_step",
                         "_update_step_xla", "_var_key")
# What adam_slots reads (tf_keras.optimizers.Adam).
ADAM_PRIVATE_API = ("_index_dict", "_momentums", "_velocities")


def missing_optimizer_api(optimizer):
    """The names of OPTIMIZER_PRIVATE_API that `optimizer` lacks, in order."""
    return [a for a in OPTIMIZER_PRIVATE_API if not hasattr(optimizer, a)]


def is_dtensor_optimizer(optimizer):
    """Whether `optimizer` runs under DTensor (a mesh, or a DTensor strategy)."""
    return bool(getattr(optimizer, "_mesh", None) or getattr(optimizer, "_run_with_dtensor", False))


def compute_current_learning_rate(optimizer):
    """Set `optimizer.learning_rate` to its schedule's value at `optimizer.iterations` (creates
    the learning-rate variable on first call)."""
    optimizer._compute_current_learning_rate()


def clip_gradients(optimizer, grads):
    """`grads` clipped as the optimizer's clipnorm / global_clipnorm / clipvalue say."""
    return optimizer._clip_gradients(grads)


def deduplicate_sparse_grad(optimizer, grads):
    """`grads` with each IndexedSlices' repeated indices summed."""
    return optimizer._deduplicate_sparse_grad(grads)


def use_weight_decay(optimizer, variable):
    """Whether the optimizer's decoupled weight decay applies to `variable` (not excluded)."""
    return optimizer._use_weight_decay(variable)


def var_key(optimizer, variable):
    """The optimizer's key for `variable`: stable for one variable, distinct between them."""
    return optimizer._var_key(variable)


def update_step(optimizer, grad, variable):
    """The optimizer's update rule on one variable (slots included), as apply_gradients runs it
    without jit_compile."""
    return optimizer._update_step(grad, variable)


def update_step_xla(optimizer, grad, variable):
    """update_step XLA-compiled, as apply_gradients runs it with jit_compile (keyed as Keras keys
    it)."""
    return optimizer._update_step_xla(grad, variable, id(optimizer._var_key(variable)))


def has_adam_slots(optimizer):
    """Whether `optimizer` keeps Adam's moments where adam_slots reads them."""
    return all(hasattr(optimizer, a) for a in ADAM_PRIVATE_API)


def adam_slots(optimizer, variable):
    """(m, v, v_hat): Adam's first and second moments of `variable`, and its running maximum of
    v when amsgrad (else None); variables of `variable`'s shape."""
    index = optimizer._index_dict[optimizer._var_key(variable)]
    v_hat = optimizer._velocity_hats[index] if optimizer.amsgrad else None
    return optimizer._momentums[index], optimizer._velocities[index], v_hat


# -- Keras 3 optimizer ------------------------------------------------------------------------

# What flavors/keras3.py calls on a keras.optimizers.Optimizer.
KERAS3_OPTIMIZER_PRIVATE_API = ("_var_key", "_clip_gradients", "_use_weight_decay",
                                "_get_variable_index", "_trainable_variables_indices")


def keras3_missing_optimizer_api(optimizer):
    """The names of KERAS3_OPTIMIZER_PRIVATE_API that `optimizer` lacks, in order."""
    return [a for a in KERAS3_OPTIMIZER_PRIVATE_API if not hasattr(optimizer, a)]


def keras3_var_key(optimizer, variable):
    """The optimizer's key for `variable` (a Keras or tf.Variable)."""
    return optimizer._var_key(variable)


def keras3_knows(optimizer, variable):
    """Whether the optimizer was built with `variable` (it refuses others)."""
    return optimizer._var_key(variable) in optimizer._trainable_variables_indices


def keras3_clip_gradients(optimizer, grads):
    """`grads` clipped as the optimizer's clipnorm / global_clipnorm / clipvalue say."""
    return optimizer._clip_gradients(grads)


def keras3_use_weight_decay(optimizer, variable):
    """Whether the optimizer's decoupled weight decay applies to `variable` (not excluded)."""
    return optimizer._use_weight_decay(variable)


def keras3_adam_slots(optimizer, variable):
    """(m, v, v_hat): a Keras 3 Adam's moments of `variable`, v_hat None unless amsgrad."""
    index = optimizer._get_variable_index(variable)
    v_hat = optimizer._velocity_hats[index] if optimizer.amsgrad else None
    return optimizer._momentums[index], optimizer._velocities[index], v_hat


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

_MODULES = {}


def _keras3_loss_module():
    # cached: the step functions that use it are traced, and tracing must not meet importlib
    if "loss" not in _MODULES:
        import importlib

        _MODULES["loss"] = importlib.import_module("keras.src.losses.loss")
    return _MODULES["loss"]


def keras3_scales_loss_for_replicas():
    """Whether this Keras 3 divides a replica's loss by the replicas in sync."""
    return hasattr(_keras3_loss_module(), "scale_loss_for_distribution")


def keras3_unscale_loss_for_replicas(loss):
    """A replica's loss as Keras 3's train_step logs it (multiplied back by the replicas)."""
    unscale = getattr(_keras3_loss_module(), "unscale_loss_for_distribution", None)
    return loss if unscale is None else unscale(loss)


def keras3_loss_tracker(model):
    """The Mean metric behind a compiled Keras 3 model's "loss" log."""
    return model._loss_tracker


# -- tf.function ------------------------------------------------------------------------------

def concrete_functions(function):
    """The concrete functions a tf.function has traced so far (empty before its first call)."""
    return function._list_all_concrete_functions()


# -- AutoGraph --------------------------------------------------------------------------------

def autograph_do_not_convert(module_prefix):
    """Make AutoGraph leave the code of `module_prefix` (a top-level module name) unconverted,
    unless a rule for it is there already."""
    from tensorflow.python.autograph.core import config as ag_config

    if not any(getattr(r, "_prefix", None) == module_prefix for r in ag_config.CONVERSION_RULES):
        ag_config.CONVERSION_RULES += (ag_config.DoNotConvert(module_prefix),)


# -- profiler ---------------------------------------------------------------------------------

def xplane_pb2():
    """TensorFlow's bundled xplane protobuf module (XSpace, the .xplane.pb format)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2 as module

    return module


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


def steps_per_execution(model):
    """A compiled tf-keras model's steps_per_execution (1 when not compiled)."""
    value = getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(value.numpy())


def is_random_layer(layer):
    """Whether `layer` draws random numbers when it runs in training mode."""
    return getattr(layer, "_random_generator", None) is not None


def layer_random_generator(layer):
    """The tf.random.Generator of a random layer (augmentation, dropout with a generator), or
    None."""
    return getattr(getattr(layer, "_random_generator", None), "_generator", None)


# -- TensorBoard ------------------------------------------------------------------------------

def tensorboard_without_tensorflow():
    """Make TensorBoard read event files with its own TensorFlow stub: it takes the stub when a
    module `tensorboard.compat.notf` can be imported (its build's no_tensorflow mode, which the
    pip package does not ship), so provide an empty one.  Skipped when TensorFlow is already
    loaded, where reading through it costs nothing more."""
    if "tensorflow" not in sys.modules:
        stub = types.ModuleType("tensorboard.compat.notf")
        sys.modules.setdefault("tensorboard.compat.notf", stub)


def load_events(run_directory):
    """An EventAccumulator over every event file of `run_directory`, fully loaded: every
    scalar and tensor event kept (its default keeps 10 tensors per tag)."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(run_directory), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def tensor_event_array(event):
    """The numpy array of a tensor event (an EventAccumulator's `Tensors(tag)` item)."""
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(event.tensor_proto)


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


# -- model.fit --------------------------------------------------------------------------------

def answer_tf_keras_batch_hooks(callback, train=True, test=False, predict=False):
    """Make `callback` answer tf-keras' CallbackList: which batch hooks it implements (tf-keras
    skips the others' calls), and that it takes its logs as numbers, not tensors."""
    callback._supports_tf_logs = False
    callback._implements_train_batch_hooks = lambda: train
    callback._implements_test_batch_hooks = lambda: test
    callback._implements_predict_batch_hooks = lambda: predict


def replace_train_function(model, function):
    """Make model.fit call `function(iterator)` for each batch instead of the model's own train
    function (tf-keras' TensorBoard callback then draws no graph of it); returns what
    restore_train_function puts back."""
    saved = (model.train_function, getattr(model, "train_tf_function", None))
    model.train_function = function
    if saved[1] is not None:
        model.train_tf_function = function
    return saved


def restore_train_function(model, saved):
    """Put back the train function(s) replace_train_function returned."""
    model.train_function = saved[0]
    if saved[1] is not None:
        model.train_tf_function = saved[1]


# -- traced graphs ----------------------------------------------------------------------------

def library_function_graphs(graph):
    """{name: FuncGraph} of the functions a traced graph holds in its library (what its If,
    While and PartitionedCall ops call, nested calls included).  The public GraphDef gives their
    FunctionDefs, which carry no tensor shapes; the traced FuncGraphs do (train/collectives.py
    reads the shapes that enter all-reduce ops)."""
    found = {}
    for name, function in getattr(graph, "_functions", {}).items():
        nested = getattr(function, "graph", None)
        if nested is not None:
            found[name] = nested
    return found
