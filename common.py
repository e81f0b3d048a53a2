"""Small pieces every entry point shares: user-facing errors, registries, quiet TensorFlow logs."""
import os
import sys

# TensorFlow prints C++ banners (oneDNN, CUDA stubs) on import; users asked for clean CLIs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr with exit code 2, no traceback."""


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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def str2bool(s):
    """argparse type for booleans: true/false/1/0/yes/no (the reference took any string but 'False' as true)."""
    v = str(s).strip().lower()
    if v in ("1", "true", "t", "yes", "y"):
        return True
    if v in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0, got {s!r}")


import argparse  # noqa: E402


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (usage is one `--help` away) and exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
