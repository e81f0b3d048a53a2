"""Private model.fit API of both Kerases: what Keras 3's train step does with the loss, which
ElasticCallback's steps do as well, and what ElasticCallback needs of a fit it did not start
(the batches one train function call runs, the hooks tf-keras asks about, the train function
itself).

Keras 3's train step (flavors/keras3.py)
    keras3_loss_tracker (`Model._loss_tracker`): the mean of the loss that model.fit reports
        as "loss"; Keras 3's train_step updates it itself, `compute_loss` does not (tf-keras's
        compute_loss updates its own).  ElasticCallback's steps (fit/steps.py) do what train_step
        does.
    keras3_unscale_loss_for_replicas (`keras.src.losses.loss.unscale_loss_for_distribution`):
        Keras 3 (from 3.4 on) divides each replica's loss by the replicas in sync, and its
        train_step logs the loss multiplied back; keras3_scales_loss_for_replicas says whether
        this Keras does (3.3 does not: its replicas' gradients are then averaged).  No public
        accessor for either.

model.fit's callbacks and train function (fit/callback.py)
    steps_per_execution (`Model._steps_per_execution`): the batches a tf-keras model.fit
        train function call runs (compile's steps_per_execution); ElasticCallback times and
        selects every step, so it needs 1.  No public accessor (Keras 3 has one).
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
"""

# -- Keras 3's train step ---------------------------------------------------------------------

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


# -- model.fit --------------------------------------------------------------------------------

def steps_per_execution(model):
    """A compiled tf-keras model's steps_per_execution (1 when not compiled)."""
    value = getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(value.numpy())


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
