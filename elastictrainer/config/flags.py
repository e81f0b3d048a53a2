"""How a setting becomes a command-line flag: the argparse types, the parser every command
shares (a bad flag is one line and exit code 2), and the `flag(...)` metadata a settings field
carries (help, choices, the default as shown) from which the parsers and the docs' flag tables
are both generated.  No TensorFlow: every command's --help and scripts' parsers import it.
"""
import argparse
import sys
from dataclasses import dataclass
from typing import Optional

from elastictrainer.elastic.budget import AUTO
from elastictrainer.errors import UserError


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


def parse_auto_bool(text):
    """argparse type of auto/true/false settings (and their reading in ElasticCallback):
    "auto", True or False."""
    if str(text).strip().lower() == AUTO:
        return AUTO
    try:
        return str2bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}") from None


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


@dataclass(frozen=True)
class Flag:
    """How a Config field appears on the command line and in docs/usage.md's flag table.

    help: plain text (no argparse %-escapes, no markdown; both renderings add their own), or a
      function giving it, for lists that grow when users register their own entries.
    choices: the valid values, or a function giving them when the parser is built (a scheme a
      user registers after this module is imported is still a valid --train_type).
    shown_default: the default as a reader should see it, where the value alone says too little
      (None usually means "derived", and this says from what).
    off_switch: for a bool field that is on by default, the name of the flag that turns it off
      (a plain switch, no value).
    switch: for a bool field that is off by default, the flag is a plain switch that turns it on.
    parse: the argparse type, where the field's annotation is not one (a comma list, say).
    """
    help: str
    choices: Optional[tuple] = None
    metavar: Optional[str] = None
    shown_default: Optional[str] = None
    off_switch: Optional[str] = None
    switch: bool = False
    parse: Optional[object] = None

    def help_text(self):
        return self.help() if callable(self.help) else self.help

    def choice_list(self):
        return tuple(self.choices()) if callable(self.choices) else self.choices


def flag(help, **kwargs):
    """Field metadata that makes a Config field a flag: `field(default=..., metadata=flag(...))`."""
    return {"flag": Flag(help, **kwargs)}


def flag_of(f):
    """The Flag of a Config field (dataclasses.Field); KeyError if it has none."""
    return f.metadata["flag"]


def option_of(f):
    """The field's command-line option, e.g. '--rho'."""
    return "--" + (flag_of(f).off_switch or f.name)


def shown_default(f):
    """The field's default as --help and the flag table show it."""
    fl = flag_of(f)
    if fl.shown_default is not None:
        return fl.shown_default
    if fl.off_switch or fl.switch:
        return "off"
    if isinstance(f.default, bool):
        return str(f.default).lower()  # as str2bool reads it
    if isinstance(f.default, float):
        return f"{f.default:g}"
    return str(f.default)


def check_positive(settings, names):
    """UserError unless each of `names` (attributes of `settings`) is None or a positive
    integer."""
    for name in names:
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} must be a positive integer, got {value}")
