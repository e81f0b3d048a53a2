"""docs/performance.md's tables are the benchmarks' own files, copied by perfdoc, never edited;
README.md's are rendered from them by readme_tables."""
import os
import re

from elastictrainer.experiments import perfdoc, readme_tables


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


def test_every_offline_figure_block_of_the_reproducing_doc_is_its_figures_table():
    """docs/reproducing.md shows each offline figure's table as `figure --offline` wrote it
    (figures/offline/<FIG>.md, its title left out), headed by the machine and the date."""
    with open(perfdoc.REPRODUCING, encoding="utf-8") as f:
        found = perfdoc.blocks(f.read())
    assert "offline_fig17" in found
    for name, body in found.items():
        expected = perfdoc.offline_table(name)
        assert expected is not None, f"{name}: no figures/offline table"
        assert body == expected, (f"docs/reproducing.md's {name} table differs from its "
                                  "figure's: run `python -m elastictrainer.experiments.perfdoc`")
        assert re.search(r"\d+ cores", body) and re.search(r"20\d\d-\d\d-\d\d", body), name
        assert "| scheme |" in body and "the paper" in body


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


def test_every_readme_table_is_a_block_rendered_from_its_benchmarks_figures():
    with open(perfdoc.README, encoding="utf-8") as f:
        text = f.read()
    found = perfdoc.blocks(text)
    assert set(found) == set(readme_tables.README_BLOCKS)
    for name, body in found.items():
        assert body == readme_tables.readme_block(name, perfdoc.FIGURES), (
            f"README.md's {name} block differs from what figures/{name}.json gives: run "
            "`python -m elastictrainer.experiments.perfdoc --readme`")
        # the benchmark that wrote it, the machine, the date, and the flags it ran with
        script = {"memory": "bench_memory",
                  "bench_time_to_accuracy_paper_auto": "bench_time_to_accuracy"}.get(name, name)
        assert f"scripts/{script}.py" in body, name
        assert re.search(r"\d+ cores", body) and re.search(r"20\d\d-\d\d-\d\d", body), name
        assert re.search(r"--[a-z_]+ \S+|economy off", body), name
    # no results table outside the blocks: every table row of the README is inside one
    outside = perfdoc._BLOCK.sub("", text)
    rows = [line for line in outside.splitlines() if line.startswith("| ") and "---" not in line]
    assert all(line.startswith("| command |") or line.startswith("| `elastictrainer")
               for line in rows), rows


# README's sentence on --rho auto: each number it quotes, from the figures file of its grid
# (file, configuration, scheme, what is quoted: points under the best, speedup to its 95%)
AUTO_QUOTES = [
    ("shift", "domain_shift_fit", "ElasticCallback rho auto", True),
    ("nested", "domain_shift_nested", "ElasticCallback rho auto", True),
    ("shift_cli_pace", "domain_shift_cli", "ElasticTrainer rho auto, share 0.7", True),
    ("paper_auto", "mobilenetv2_paper", "ElasticTrainer rho auto, share 0.7", True),
    ("textures_shares", "efficientnet_textures", "ElasticTrainer rho auto, share 0.7", False),
    ("imagenet_shares", "efficientnet_imagenet", "ElasticTrainer rho auto, share 0.7", False)]


def test_the_readmes_rho_auto_sentence_quotes_the_figures():
    import json

    with open(perfdoc.README, encoding="utf-8") as f:
        sentence = next(line for line in f if line.startswith("`--rho auto` asks for no ratio"))
    for name, config, scheme, reaches in AUTO_QUOTES:
        path = os.path.join(perfdoc.FIGURES, f"bench_time_to_accuracy_{name}.json")
        with open(path, encoding="utf-8") as f:
            row = json.load(f)["configs"][config]["schemes"][scheme]
        assert row["runs"] == 3 and "three seeds" in sentence
        assert f"{row['under_reference_best']:.1f}" in sentence, (name, row)
        speedup = row["p95"]["speedup"]
        assert (speedup is not None) == reaches, name
        if reaches:
            assert f"{speedup:.2f}x" in sentence, (name, speedup)


def test_command_1s_table_is_the_fresh_clones_run_at_seed_0(tmp_path):
    import json
    import shutil

    figures = tmp_path / "figures"
    shutil.copytree(perfdoc.FIGURES, figures)
    path = figures / "bench_readme_command.json"
    data = json.loads(path.read_text())
    seed0 = next(r for r in data["results"] if r["seed"] == 0)
    elastic = seed0["schemes"]["ElasticTrainer"]
    body = readme_tables.readme_command(str(figures))
    assert (f"| ElasticTrainer | 0.5 | {elastic['best']:.1f}% | {elastic['last']:.1f}% | "
            f"{elastic['time_ratio']:.2f} | {elastic['measured_ratio']:.2f} | "
            f"{elastic['selected']}/{elastic['tensors']} |") in body
    assert f"`{data['command']}`" in body and f"{seed0['command_s'] / 60:.1f} min" in body
    # another seed's numbers in seed 0's place: the block follows the file, not a pasted run
    other = next(r for r in data["results"] if r["seed"] != 0)
    seed0["schemes"] = other["schemes"]
    path.write_text(json.dumps(data))
    changed = readme_tables.readme_command(str(figures))
    assert f"| {other['schemes']['ElasticTrainer']['best']:.1f}% |" in changed
    assert changed != body


def test_update_readme_rewrites_only_its_block(tmp_path):
    import shutil

    figures = tmp_path / "figures"
    shutil.copytree(perfdoc.FIGURES, figures)
    readme = tmp_path / "README.md"
    readme.write_text("# R\n<!-- bench:bench_keras -->\nold\n<!-- /bench:bench_keras -->\n"
                      "<!-- bench:memory -->\nkept\n<!-- /bench:memory -->\n")
    assert perfdoc.update_readme("bench_keras", readme=str(readme), figures=str(figures))
    assert readme.read_text() == ("# R\n<!-- bench:bench_keras -->\n"
                                  + readme_tables.readme_block("bench_keras", str(figures))
                                  + "<!-- /bench:bench_keras -->\n"
                                  "<!-- bench:memory -->\nkept\n<!-- /bench:memory -->\n")
    assert not perfdoc.update_readme("bench_keras", readme=str(readme), figures=str(figures))
    assert not perfdoc.update_readme("bench_dp", readme=str(readme), figures=str(figures))
    assert perfdoc.main(["--readmee"]) == 2
