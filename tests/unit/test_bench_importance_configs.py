"""scripts/bench_importance.py --configs: a finished configuration is read back, not measured
again; an unknown one is refused in one line with exit code 2; the table shows each
estimator's rank correlation, its 70% selection's realized drop and realized over predicted by
depth."""
import json

import numpy as np
import pytest

from helpers import load_script
from elastictrainer.experiments import importance_report as report
from elastictrainer.experiments import importance_truth as it


def _script():
    return load_script("bench_importance")


def _record(name, seed, steps=10, probes=2):
    drop = np.array([-0.2, 0.1, 0.3, 0.4])
    est = {"taylor": np.array([4.0, 1.0, 1.0, 1.0]), "cross": np.array([0.0, 1.0, 2.0, 3.0])}
    return {"config": name, "seed": seed, "steps": steps, "probes": probes,
            "held_out_loss": 1.0, "dropN": drop.tolist(),
            "estimates": {k: v.tolist() for k, v in est.items()},
            "summary": report.summarize(drop, est, steps, probes, bins=2)}


def test_finished_configurations_are_read_back_and_tabled(tmp_path, monkeypatch, capsys):
    calls = []

    def measure(name, seed, steps, probes):
        calls.append((name, seed))
        return _record(name, seed, steps, probes)

    monkeypatch.setattr(it, "measure", measure)
    out = str(tmp_path / "truth")
    script = _script()
    script.main(["--configs", "domain_shift_nested", "--seeds", "0,1", "--out", out])
    assert calls == [("domain_shift_nested", 0), ("domain_shift_nested", 1)]
    script.main(["--configs", "domain_shift_nested,domain_shift_fit", "--seeds", "0",
                 "--out", out])
    assert calls[2:] == [("domain_shift_fit", 0)]  # the nested seed 0 was read back
    with open(out + ".json") as f:
        assert len(json.load(f)["runs"]) == 3
    with open(out + ".md") as f:
        table = f.read()
    # taylor's 70% selection: tensors 0 and 1 (5 of 7), which together raise the loss
    assert "| taylor | -0.77 | 4 | 2, 0 | -0.100 |" in table
    assert "| 0-1 | -0.100 |" in table and "**domain_shift_fit** (1 seed(s)" in table


def test_an_unknown_configuration_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        _script().main(["--configs", "imagenet_full"])
    assert e.value.code == 2
    assert "--configs imagenet_full: not one of domain_shift_nested" in capsys.readouterr().err


def test_the_truths_split_half_agreement_and_its_ceiling_are_tabled():
    # dropN on the first and second held-out half: ranks 0 1 2 3 against 0 2 1 3
    by_batch = np.array([[0.1, 0.1], [0.2, 0.3], [0.3, 0.2], [0.4, 0.4]])
    assert report.split_half(by_batch) == pytest.approx(0.8)
    assert report.split_half(by_batch[:, :1]) is None
    assert report.ceiling(0.8) == pytest.approx(np.sqrt(1.6 / 1.8)) and report.ceiling(-0.2) == 0.0
    record = dict(_record("efficientnet_textures", 0), split_half=report.split_half(by_batch))
    table = report.markdown({"machine": "m", "date": "d", "command": "c", "runs": [record]})
    assert ("ranks the tensors alike at +0.80, so an exact estimate would be measured at "
            "about +0.94") in table
