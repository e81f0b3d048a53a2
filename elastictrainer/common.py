"""Small pieces every entry point shares: user-facing errors, registries, argparse types.

Imports nothing heavy: `--help`, `plot` and the package itself must start without TensorFlow.
"""
import argparse
import sys


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr with exit code 2, no traceback."""


class RunError(Exception):
    """A run that cannot go on (a NaN loss, ...): one line on stderr, exit code 1."""


class Registry(dict):
    """Name -> object map whose lookup failure lists the valid names (the official/core habit).

    Insertion order is kept: CLI choices and plot legends list entries in registration order.
    """

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def register(self, name):
        def deco(obj):
            if name in self:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self[name] = obj
            return obj
        return deco

    def get_or_fail(self, name):
        if name not in self:
            raise UserError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self))}")
        return self[name]


def one_line(exc, limit=400):
    """An exception's message squeezed onto one line (UserError messages must be one line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_writable_dir(path, flag):
    """Create `path` if needed and check that files can be written there; UserError if not."""
    import os
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = e.strerror or one_line(e)
        raise UserError(f"{flag} {path}: cannot write there ({reason})") from None


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


def run_cli(fn, argv=None):
    """Run fn(argv) as a command: UserError -> one line + exit 2, Ctrl-C -> exit 130."""
    try:
        code = fn(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def comma_list(cast, what="numbers"):
    """argparse type for '0.4,0.5' -> (0.4, 0.5); a bad or empty list is a usage error."""
    def parse(text):
        try:
            values = tuple(cast(v) for v in str(text).split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got an empty list")
        return values
    return parse


def str2bool(s):
    """argparse type for booleans: true/false/1/0/yes/no (the reference took any string but 'False' as true)."""
    v = str(s).strip().lower()
    if v in ("1", "true", "t", "yes", "y"):
        return True
    if v in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0, got {s!r}")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to a flag's help unless the help already names its default or the
    default is None (which means "derived", and the help says from what)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (usage is one `--help` away) and exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
