"""docs/performance.md's tables are the benchmarks' own files, copied by perfdoc, never edited."""
import os
import re

from elastictrainer.experiments import perfdoc


def test_every_block_of_the_performance_doc_is_its_benchmarks_file():
    with open(perfdoc.DOC, encoding="utf-8") as f:
        found = perfdoc.blocks(f.read())
    assert {"bench_runtime", "memory"} <= set(found)
    for name, body in found.items():
        path = perfdoc.table_file(name)
        assert os.path.exists(path), f"{name}: no {path}"
        with open(path, encoding="utf-8") as f:
            assert body == f.read(), (f"docs/performance.md's {name} table differs from {path}: "
                                      "run `python -m elastictrainer.experiments.perfdoc`")
        # headed by the machine and the date it ran on
        assert re.search(r"\d+ cores", body) and re.search(r"20\d\d-\d\d-\d\d", body), name


def test_update_rewrites_only_its_block(tmp_path):
    figures, doc = tmp_path / "figures", tmp_path / "performance.md"
    figures.mkdir()
    (figures / "a.md").write_text("Machine: X.\n\n| new |\n")
    doc.write_text("# P\n\n<!-- bench:a -->\n| old |\n<!-- /bench:a -->\n\n"
                   "<!-- bench:b -->\n| b |\n<!-- /bench:b -->\ntail\n")
    assert perfdoc.update("a", doc=str(doc), figures=str(figures)) is True
    assert doc.read_text() == ("# P\n\n<!-- bench:a -->\nMachine: X.\n\n| new |\n"
                               "<!-- /bench:a -->\n\n<!-- bench:b -->\n| b |\n<!-- /bench:b -->\n"
                               "tail\n")
    assert perfdoc.update("a", doc=str(doc), figures=str(figures)) is False  # up to date
    assert perfdoc.update("b", doc=str(doc), figures=str(figures)) is False  # no figures/b.md
