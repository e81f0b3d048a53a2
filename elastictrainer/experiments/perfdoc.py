"""docs/performance.md's tables: written by the benchmarks, never by hand.

Each benchmark writes its table, headed by the machine and the date it ran on, to
figures/<name>.md and then calls `update_for(that path)`, which copies the file between the
`<!-- bench:<name> -->` and `<!-- /bench:<name> -->` markers of docs/performance.md.
`python -m elastictrainer.experiments.perfdoc` copies every table again (after a merge, say); the tests
check that each block equals its file.  No TensorFlow.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the clone
DOC = os.path.join(HERE, "docs", "performance.md")
FIGURES = os.path.join(HERE, "figures")
_BLOCK = re.compile(r"<!-- bench:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /bench:(?P=name) -->",
                    re.S)


def blocks(text):
    """{name: body} of every benchmark block in `text`."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def table_file(name, figures=FIGURES):
    return os.path.join(figures, f"{name}.md")


def update(name, doc=DOC, figures=FIGURES):
    """Copy figures/<name>.md into the doc's block `name`; True when the doc changed.  A doc
    without that block is left as it is (a benchmark run outside a clone, or into another
    --out)."""
    if not os.path.exists(doc) or not os.path.exists(table_file(name, figures)):
        return False
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    with open(table_file(name, figures), encoding="utf-8") as f:
        body = f.read()
    body = body if body.endswith("\n") else body + "\n"
    begin, end = f"<!-- bench:{name} -->\n", f"<!-- /bench:{name} -->"
    i = text.find(begin)
    j = text.find(end, i)
    if i < 0 or j < 0 or text[i + len(begin):j] == body:
        return False
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text[:i + len(begin)] + body + text[j:])
    return True


def update_for(out_path):
    """update() for a benchmark that wrote `out_path` (.md or .json): only when it wrote into
    this clone's figures/, the tables the doc shows."""
    stem = os.path.splitext(os.path.abspath(out_path))[0]
    if os.path.dirname(stem) == FIGURES:
        update(os.path.basename(stem))


def write_benchmark(out, results, text):
    """A benchmark's results: `out`.json (the numbers) and `out`.md (`text`, its table), both
    whole or absent, and its block of the doc when `out` is in this clone's figures/."""
    import json

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for path, content in ((out + ".json", json.dumps(results, indent=1)), (out + ".md", text)):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(path + ".tmp", path)
    update_for(out + ".md")


def main():
    with open(DOC, encoding="utf-8") as f:
        names = list(blocks(f.read()))
    for name in names:
        print(f"{name}: " + ("rewritten" if update(name) else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
