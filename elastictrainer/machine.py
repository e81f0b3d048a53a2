"""The machine a run or a benchmark runs on: its CPU and cores, this process's peak memory, giving
freed memory back to the OS, and the environment variables that set TensorFlow's devices up
before it starts (read by flavors/tf_setup.py).  Plain Python."""


def peak_rss_mb():
    """This process's peak resident set size so far, in MB (Linux reports KiB, macOS bytes)."""
    import resource
    import sys as _sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if _sys.platform == "darwin" else peak / 1024


def cpu_model():
    """The CPU's name as /proc/cpuinfo gives it (a Jetson's "Hardware" line), else platform's."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "processor\t: arm")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# How many logical devices to split the CPU into (--strategy mirrored --logical_cpus N), read by
# tf_setup.py as TensorFlow starts: TensorFlow fixes its devices at their first use.
LOGICAL_CPUS_ENV = "ELASTICTRAINER_LOGICAL_CPUS"
# Set when TensorFlow must not make its devices as it starts: MultiWorkerMirroredStrategy
# configures the collective ops, which only a process whose devices are not made yet can.
DEFER_DEVICES_ENV = "ELASTICTRAINER_DEFER_DEVICES"


def release_memory():
    """Collect garbage, then hand glibc's free heap pages back to the OS (malloc_trim): freed
    graphs and buffers (a profile made in-process, a compiled step dropped) would otherwise stay
    in this process's resident set under training's own allocations.  A no-op where there is
    no glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def machine_info(tensorflow_version=None):
    """What a benchmark ran on, recorded with its numbers: CPU, cores, OS, TensorFlow, Python.
    `tensorflow_version` for a benchmark whose runs use another interpreter."""
    import os
    import platform

    if tensorflow_version is None:
        import tensorflow as tf

        tensorflow_version = tf.__version__
    return {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "tensorflow": tensorflow_version, "python": platform.python_version()}


def machine_text(m):
    """machine_info as the one line a benchmark table is headed with."""
    return f"{m['cpu']}, {m['cores']} cores, {m['platform']}, TensorFlow {m['tensorflow']}"
