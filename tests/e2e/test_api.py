"""The Python API: the README's example, executed as written."""
import json
import os
import re

from helpers import ROOT, write_image_folder
from elastictrainer import runlog
from elastictrainer.elastic import SHORT_RUN



def readme_example():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README lost its API example"
    return m.group(1)


def test_readme_api_example_runs(tmp_path, monkeypatch, capsys):
    from pathlib import Path
    write_image_folder(Path(tmp_path) / "my_images", per_class=16)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    summary = namespace["summary"]
    assert summary["status"] == "finished" and len(summary["epochs"]) == 3
    assert summary["model"] == "my_model" and summary["measured_ratio"] is not None
    # 15 steps of a model this small cannot pay for a selection's compile: full training
    (record,) = summary["selections"]
    assert record["reason"] == SHORT_RUN and all(record["mask"])
    runs = os.listdir(tmp_path / "logs")
    assert len(runs) == 1
    saved = json.load(open(tmp_path / "logs" / runs[0] / runlog.SUMMARY_FILE))
    assert saved["best_test_accuracy"] == summary["best_test_accuracy"]
    assert os.path.exists(tmp_path / "profiles" / "my_model_i64_b8_c3_adam.json")
    printed = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert float(printed[0]) == summary["best_test_accuracy"]
