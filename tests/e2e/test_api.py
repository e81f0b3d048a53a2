"""The Python API: the README's model.fit example and docs/usage.md's elastictrainer.run
example, executed as written."""
import json
import os
import re

import pytest

from helpers import ROOT, write_image_folder
from elastictrainer import runlog
from elastictrainer.elastic import SHORT_RUN

pytestmark = pytest.mark.tf_versions



def example(marker, path):
    text = open(os.path.join(ROOT, path)).read()
    m = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"{path} lost its {marker}"
    return m.group(1)


def test_readme_fit_example_runs(tmp_path, monkeypatch, capsys):
    """Keras 3's model.fit with ElasticCallback, as the README shows it first."""
    from pathlib import Path
    write_image_folder(Path(tmp_path) / "my_images", per_class=16)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(example("fit-example", "README.md"), "README.md", "exec"), namespace)
    history = namespace["history"].history
    assert len(history["elastic_measured_ratio"]) == 3 and len(history["val_accuracy"]) == 3
    summary = runlog.read_summary(str(tmp_path / "logs" / "my_run"))
    assert summary["status"] == "finished" and summary["model"] == "my_model"
    assert len(summary["epochs"]) == 3 and summary["measured_ratio"] is not None
    assert os.path.exists(tmp_path / "logs" / "my_run" / runlog.CONFIG_FILE)
    assert len(os.listdir(tmp_path / "profiles")) == 1  # profiled on the first batch
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("[") and len(printed.split(",")) == 3


def test_usage_api_example_runs(tmp_path, monkeypatch, capsys):
    from pathlib import Path
    write_image_folder(Path(tmp_path) / "my_images", per_class=16)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(example("api-example", "docs/usage.md"), "docs/usage.md", "exec"), namespace)
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
