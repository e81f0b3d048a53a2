"""compare.py: several schemes on the same settings, one table, and a finished run read back
instead of trained again."""
import json
import os

import compare as compare_cli
from elastictrainer import runlog
from elastictrainer.experiments import compare
from helpers import smallcnn_scripted_table


ARGV = ["--model_name", "smallcnn", "--weights", "none", "--dataset_name", "synthetic",
        "--num_train", "32", "--num_test", "16", "--input_size", "16", "--batch_size", "8",
        "--num_epochs", "4", "--optimizer", "adam", "--learning_rate", "0.001", "--quiet"]
TYPES = ("full_training", "elastic_training", "traditional_tl_training")


def _rows(table):
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_compare_runs_each_scheme_once_and_tables_them(tmp_path, capsys):
    # a scripted timing table: a run's first profiling, compare.py's as main.py's, is
    # e2e/test_resume.py's and integration/test_profiler.py's
    smallcnn_scripted_table(tmp_path / "table.json")
    logdir = tmp_path / "logs"
    argv = ARGV + ["--logdir", str(logdir), "--rho", "0.9", "--train_types", ",".join(TYPES),
                   "--timing_table", str(tmp_path / "table.json")]
    assert compare_cli.main(argv) == 0
    printed = capsys.readouterr().out
    md = (logdir / f"compare_{compare.COMPARE_FILE}").read_text()
    assert md.strip() in printed

    summaries = [json.load(open(logdir / f"compare_{t}" / runlog.SUMMARY_FILE)) for t in TYPES]
    rows = _rows(md)
    assert [r[0] for r in rows] == ["Full training", "ElasticTrainer", "Traditional TL"]
    for row, s in zip(rows, summaries):
        assert s["status"] == "finished" and len(s["epochs"]) == 4
        accs = [e["test_accuracy"] for e in s["epochs"]]
        assert row[2] == f"{s['best_test_accuracy']:.1f}%"
        assert row[3] == f"{sum(accs[-3:]) / 3:.1f}%"  # the last 3 epochs, not all 4
        assert row[5] == f"{s['train_time_s'] / summaries[0]['train_time_s']:.2f}"
    assert rows[1][1] == "0.9" and rows[1][6] != "" and rows[0][6] == ""

    # again: every run is finished, so each is read from its directory, none trained again
    stamps = {t: os.path.getmtime(logdir / f"compare_{t}" / runlog.SUMMARY_FILE) for t in TYPES}
    assert compare_cli.main(argv) == 0
    assert capsys.readouterr().out.count("finished before, read from") == 3
    assert stamps == {t: os.path.getmtime(logdir / f"compare_{t}" / runlog.SUMMARY_FILE)
                      for t in TYPES}
    assert (logdir / f"compare_{compare.COMPARE_FILE}").read_text() == md
