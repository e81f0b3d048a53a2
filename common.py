"""Small pieces every entry point shares: user-facing errors, registries, quiet TensorFlow logs."""
import argparse
import os
import sys

# TensorFlow prints C++ banners (oneDNN, CUDA stubs) on import; users asked for clean CLIs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _import_tensorflow_quietly():
    """Import TensorFlow with the C-level stderr silenced.

    TF 2.21 logs through absl before absl reads any log level, so TF_CPP_MIN_LOG_LEVEL cannot
    stop its banners; pointing fd 2 at /dev/null for the import can.  An import failure is
    re-raised with what TensorFlow printed.
    """
    if "tensorflow" in sys.modules or os.environ.get("ET_TF_VERBOSE"):
        return
    import tempfile
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
            import tf_keras  # noqa: F401
            tensorflow.config.list_logical_devices()  # device set-up logs (cuInit) too
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


_import_tensorflow_quietly()


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr with exit code 2, no traceback."""


class RunError(Exception):
    """A run that cannot go on (a NaN loss, ...): one line on stderr, exit code 1."""


class Registry(dict):
    """Name -> object map whose lookup failure lists the valid names (the official/core habit)."""

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


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (usage is one `--help` away) and exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
