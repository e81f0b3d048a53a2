"""What goes wrong, said in one line: the user's bad input (UserError: exit code 2, no traceback),
a run that cannot go on (RunError: exit code 1), a registry lookup that names the valid
choices, and running a command with these rules (run_cli).

Imports nothing heavy: `--help`, `plot` and the package itself start without TensorFlow.
"""
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
