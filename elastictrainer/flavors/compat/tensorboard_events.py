"""Private TensorBoard API: a run's event files read without starting TensorFlow.

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
