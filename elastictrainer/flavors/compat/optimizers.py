"""Private optimizer API of both Kerases: the steps tf-keras' `apply_gradients` and Keras 3's
`apply` run around an optimizer's update rule, which flavors/optimizers.apply_updates runs
without their merge_call, and Adam's moments of one variable.

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
"""

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
