"""The flag tables in docs/usage.md and docs/reproducing.md, generated from the commands'
settings (Config, ProfileConfig, FigureConfig) so that the docs cannot drift from the parsers:
each table as markdown, and rewritten in place between its markers.  `python -m
elastictrainer.config [--write]` prints the tables or rewrites the docs' blocks; the tests
compare the docs with them.
"""
import os
import re
import sys
from dataclasses import fields

from elastictrainer.config.commands import FigureConfig, ProfileConfig
from elastictrainer.config.flags import flag_of, option_of, shown_default
from elastictrainer.config.settings import Config
from elastictrainer.errors import UserError

# the repository's docs/, beside the package
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs")
USAGE_DOC = os.path.join(DOCS, "usage.md")
# each command's flag table: the settings it is made from, and the doc that shows it between
# its markers
DOC_TABLES = {"train": (Config, USAGE_DOC), "profile": (ProfileConfig, USAGE_DOC),
              "figure": (FigureConfig, os.path.join(DOCS, "reproducing.md"))}


def table_markers(command="train"):
    return f"<!-- flags:{command} -->", f"<!-- /flags:{command} -->"


TABLE_BEGIN, TABLE_END = table_markers("train")
# Flags and $VARIABLES read as code, and so must a word with <placeholders>, which GitHub would
# otherwise drop as an HTML tag.
_CODE = re.compile(r"(?<![\w`-])(--\w+|\$\w+|[^\s`(),;]*<[^\s`(),;]*)")


def _markdown(text):
    return _CODE.sub(r"`\1`", text).replace("|", "\\|")


def flag_table(settings=Config):
    """A command's flags as a markdown table, one row per field of its settings, in order."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    rows += [f"| `{option_of(f)}` | {_markdown(shown_default(f))} | {_markdown(flag_of(f).help_text())} |"
             for f in fields(settings)]
    return "\n".join(rows) + "\n"


def documented_flag_table(text, command="train"):
    """The flag table between `command`'s markers in `text`; None without the markers."""
    begin_marker, end_marker = table_markers(command)
    begin, end = text.find(begin_marker), text.find(end_marker)
    if begin < 0 or end < begin:
        return None
    return text[begin + len(begin_marker):end].lstrip("\n")


def write_flag_table(path=USAGE_DOC, command="train"):
    """Put `command`'s flag_table() between its markers in `path`; True when the file
    changed."""
    begin_marker, end_marker = table_markers(command)
    table = flag_table(DOC_TABLES[command][0])
    text = open(path, encoding="utf-8").read()
    old = documented_flag_table(text, command)
    if old is None:
        raise UserError(f"{path} has no {begin_marker} ... {end_marker} block")
    if old == table:
        return False
    begin, end = text.index(begin_marker) + len(begin_marker), text.index(end_marker)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:begin] + "\n" + table + text[end:])
    return True


def main(argv):
    """python -m elastictrainer.config [--write]: print the tables, or rewrite the docs'
    blocks."""
    if argv == ["--write"]:
        for command, (_, doc) in DOC_TABLES.items():
            changed = write_flag_table(doc, command)
            print(f"{doc} ({command}): " + ("table rewritten" if changed else "up to date"))
    elif argv:
        print("usage: python -m elastictrainer.config [--write]", file=sys.stderr)
        sys.exit(2)
    else:
        for command, (settings, _) in DOC_TABLES.items():
            print(f"{table_markers(command)[0]}\n{flag_table(settings)}")
