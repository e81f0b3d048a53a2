"""The performance tables of docs/performance.md and README.md: written by the benchmarks, never
by hand.

Each benchmark writes its results, headed by the machine and the date it ran on, to
figures/<name>.json and its table to figures/<name>.md, and then calls `update_for(that path)`,
which copies the .md file between the `<!-- bench:<name> -->` and `<!-- /bench:<name> -->`
markers of docs/performance.md, and rewrites README.md's block of the same name, a shorter
excerpt rendered from the figures (readme_tables.py renders it: the numbers from the .json, with
the machine, the date and the flags the benchmark ran with).
`python -m elastictrainer.experiments.perfdoc` copies and renders every block again (after a
merge, say; `--readme`: README.md's alone); the tests check that each block equals what its
figures give.  No TensorFlow.
"""
import os
import re
import sys

from elastictrainer.experiments import readme_tables

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the clone
DOC = os.path.join(HERE, "docs", "performance.md")
README = os.path.join(HERE, "README.md")
# the offline figures' tables (figures/offline/<FIG>.md) in docs/reproducing.md's blocks
# `offline_<FIG>`, written by `elastictrainer figure FIG --offline`
REPRODUCING = os.path.join(HERE, "docs", "reproducing.md")
OFFLINE_PREFIX = "offline_"
FIGURES = os.path.join(HERE, "figures")
_BLOCK = re.compile(r"<!-- bench:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /bench:(?P=name) -->",
                    re.S)


def blocks(text):
    """{name: body} of every benchmark block in `text`."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def table_file(name, figures=FIGURES):
    return os.path.join(figures, f"{name}.md")


def _replace_block(doc, name, body):
    """Put `body` between the doc's markers of block `name`; True when the doc changed.  A doc
    without that block is left as it is."""
    if not os.path.exists(doc):
        return False
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    body = body if body.endswith("\n") else body + "\n"
    begin, end = f"<!-- bench:{name} -->\n", f"<!-- /bench:{name} -->"
    i = text.find(begin)
    j = text.find(end, i)
    if i < 0 or j < 0 or text[i + len(begin):j] == body:
        return False
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text[:i + len(begin)] + body + text[j:])
    return True


def update(name, doc=DOC, figures=FIGURES):
    """Copy figures/<name>.md into the doc's block `name`; True when the doc changed.  A doc
    without that block is left as it is (a benchmark run outside a clone, or into another
    --out)."""
    if not os.path.exists(table_file(name, figures)):
        return False
    with open(table_file(name, figures), encoding="utf-8") as f:
        return _replace_block(doc, name, f.read())


def offline_table(name, figures=FIGURES):
    """docs/reproducing.md's block `name` (offline_<FIG>): figures/offline/<FIG>.md without its
    title; None when the figure has not run."""
    path = os.path.join(figures, "offline", name[len(OFFLINE_PREFIX):] + ".md")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    return "".join(lines[1:] if lines and lines[0].startswith("# ") else lines).lstrip("\n")


def update_offline(fig, doc=REPRODUCING, figures=FIGURES):
    """Copy figure `fig`'s offline table into the doc's block offline_<fig>; True when the doc
    changed."""
    body = offline_table(OFFLINE_PREFIX + fig, figures)
    return body is not None and _replace_block(doc, OFFLINE_PREFIX + fig, body)


def update_readme(name, readme=README, figures=FIGURES):
    """Render README.md's block `name` from figures/<name>.json (readme_tables.README_BLOCKS);
    True when the README changed.  False for a name without a README block or without its
    figures."""
    if (name not in readme_tables.README_BLOCKS
            or not os.path.exists(os.path.join(figures, f"{name}.json"))):
        return False
    return _replace_block(readme, name, readme_tables.readme_block(name, figures))


def update_for(out_path):
    """update() and update_readme() for a benchmark that wrote `out_path` (.md or .json; both
    written first): only when it wrote into this clone's figures/, the tables the docs show."""
    stem = os.path.splitext(os.path.abspath(out_path))[0]
    if os.path.dirname(stem) == FIGURES:
        update(os.path.basename(stem))
        update_readme(os.path.basename(stem))
        if os.path.basename(stem) == readme_tables.PAPER_GRID:
            update_readme(readme_tables.PAPER_NOW)  # its fixed choices are in PAPER_NOW's block


def write_benchmark(out, results, text):
    """A benchmark's results: `out`.json (the numbers) and `out`.md (`text`, its table), both
    whole or absent, and its blocks of the docs when `out` is in this clone's figures/."""
    import json

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for path, content in ((out + ".json", json.dumps(results, indent=1)), (out + ".md", text)):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(path + ".tmp", path)
    update_for(out + ".md")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--readme"]):
        print("usage: python -m elastictrainer.experiments.perfdoc [--readme]", file=sys.stderr)
        return 2
    if not args:
        with open(DOC, encoding="utf-8") as f:
            names = list(blocks(f.read()))
        for name in names:
            print(f"docs/performance.md {name}: " + ("rewritten" if update(name) else "up to date"))
        with open(REPRODUCING, encoding="utf-8") as f:
            names = [n for n in blocks(f.read()) if n.startswith(OFFLINE_PREFIX)]
        for name in names:
            changed = update_offline(name[len(OFFLINE_PREFIX):])
            print(f"docs/reproducing.md {name}: " + ("rewritten" if changed else "up to date"))
    with open(README, encoding="utf-8") as f:
        names = list(blocks(f.read()))
    for name in names:
        print(f"README.md {name}: " + ("rewritten" if update_readme(name) else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
