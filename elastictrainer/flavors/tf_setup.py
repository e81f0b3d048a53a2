"""Import TensorFlow once, quietly, and filter the one warning our design triggers on purpose.

Every module that needs TensorFlow imports this module first (`from elastictrainer import
tf_setup  # noqa: F401`); modules that must stay light (the CLI parsers, plotting, the solver,
the time model) never do, so `--help` and `elastictrainer plot` start without TensorFlow.
"""
import logging
import os
import sys
import tempfile

from elastictrainer.machine import DEFER_DEVICES_ENV

# TensorFlow prints C++ banners (oneDNN, CUDA stubs) on import; users asked for clean CLIs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RETRACING_MESSAGE = "triggered tf.function retracing"


def _import_tensorflow_quietly():
    """Import TensorFlow with the C-level stderr silenced.

    TF 2.21 logs through absl before absl reads any log level, so TF_CPP_MIN_LOG_LEVEL cannot
    stop its banners; pointing fd 2 at /dev/null for the import can.  An import failure is
    re-raised with what TensorFlow printed.  ET_TF_VERBOSE=1 keeps the banners.
    """
    if "tensorflow" in sys.modules or os.environ.get("ET_TF_VERBOSE"):
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
            import tf_keras  # noqa: F401
            split_cpu(tensorflow)
            if not os.environ.get(DEFER_DEVICES_ENV):
                tensorflow.config.list_logical_devices()  # device set-up logs (cuInit) too
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def split_cpu(tensorflow):
    """Split the CPU into machine.LOGICAL_CPUS_ENV logical devices, if set (the command line
    sets it before TensorFlow starts: distribution.prepare_process)."""
    from elastictrainer.machine import LOGICAL_CPUS_ENV

    n = int(os.environ.get(LOGICAL_CPUS_ENV, "0") or 0)
    if n > 1:
        cpu = tensorflow.config.list_physical_devices("CPU")[0]
        tensorflow.config.set_logical_device_configuration(
            cpu, [tensorflow.config.LogicalDeviceConfiguration()] * n)


class DropRetracingWarning(logging.Filter):
    """Drops TensorFlow's "N out of the last M calls to ... triggered tf.function retracing".

    One compiled train step per tensor selection is the design (train/steps.py make_train_step, cached
    by trainer.StepCache), so every run with several selections would print it; every other
    TensorFlow message passes.
    """

    def filter(self, record):
        return RETRACING_MESSAGE not in record.getMessage()


_import_tensorflow_quietly()
import tensorflow as _tf  # noqa: E402

if os.environ.get("ET_TF_VERBOSE") and not _tf.config.list_logical_devices("CPU")[1:]:
    split_cpu(_tf)  # the quiet import was skipped

_tf.get_logger().addFilter(DropRetracingWarning())


def _autograph_skips_tf_keras():
    """TF 2.21's AutoGraph leaves tf_keras' own code unconverted; 2.16's rules name only
    'keras', so every new train step (one per selection) transpiled all of tf_keras: 15 s for
    the first trace instead of 1 s, 0.8 s for each later one instead of 0.2 s (measured).
    Adding the 2.21 rule changes no traced op.  Private TensorFlow API (compat/tracing.py);
    `autograph=False` would also stop converting users' own layers."""
    from elastictrainer.flavors import compat

    compat.autograph_do_not_convert("tf_keras")


_autograph_skips_tf_keras()
