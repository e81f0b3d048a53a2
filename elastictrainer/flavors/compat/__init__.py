"""Every use of private TensorFlow, tf-keras, Keras 3 and TensorBoard API in the package, one
small function each.  Private API lives only under flavors/compat/: no other module reaches past
the public API of these libraries (tests/integration/test_compat.py checks), so a release that
moves an internal breaks here, where each use says why the public API will not do.

Callers import the package (`from elastictrainer.flavors import compat`) and call what it
re-exports (`compat.var_key(...)`); each submodule holds one kind of use, its docstring the why
of each:
    optimizers.py          the steps tf-keras' apply_gradients and Keras 3's apply run inside
                           merge_call, Adam's moments of one variable
    layers.py              both Kerases' layers: own weights, the calls of a functional model,
                           name scopes, random generators, a call argument forced on a layer
    fit.py                 model.fit: Keras 3's loss in its train step, steps_per_execution,
                           tf-keras' batch hooks, the train function ElasticCallback replaces
    tracing.py             tf.function's traced graphs, AutoGraph's conversion rules, the
                           profiler's xplane protobuf
    tensorboard_events.py  a run's event files read without starting TensorFlow

Checked against TensorFlow 2.16 with tf-keras 2.16 and TensorFlow 2.21 with tf-keras 2.21
(flavors/tf_keras.py's TESTED_TF_KERAS; tests/integration/test_compat.py calls every function
here on both).  Importing this package imports nothing from TensorFlow: what needs it imports it
inside the function, so modules that load without TensorFlow (runlog, which plotting imports;
profiler.trace) can import it.
"""
from elastictrainer.flavors.compat.fit import (
    answer_tf_keras_batch_hooks, keras3_loss_tracker, keras3_scales_loss_for_replicas,
    keras3_unscale_loss_for_replicas, replace_train_function, restore_train_function,
    steps_per_execution)
from elastictrainer.flavors.compat.layers import (
    force_call_argument, is_random_layer, keras3_flatten_layers, keras3_node_call,
    keras3_own_trainable_variables, keras_history, layer_input_tensors, layer_name_scope,
    layer_random_generator, own_trainable_weights, release_call_argument, tf_keras_node_call)
from elastictrainer.flavors.compat.optimizers import (
    ADAM_PRIVATE_API, KERAS3_OPTIMIZER_PRIVATE_API, OPTIMIZER_PRIVATE_API, adam_slots,
    clip_gradients, compute_current_learning_rate, deduplicate_sparse_grad, has_adam_slots,
    is_dtensor_optimizer, keras3_adam_slots, keras3_clip_gradients, keras3_knows,
    keras3_missing_optimizer_api, keras3_use_weight_decay, keras3_var_key,
    missing_optimizer_api, update_step, update_step_xla, use_weight_decay, var_key)
from elastictrainer.flavors.compat.tensorboard_events import (
    load_events, tensor_event_array, tensorboard_without_tensorflow)
from elastictrainer.flavors.compat.tracing import (
    autograph_do_not_convert, concrete_functions, library_function_graphs, xplane_pb2)
