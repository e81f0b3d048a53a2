"""scripts/bench_readme_command.py: what it reads from a finished command's logs, what it reads
back from its figures, and the README printing exactly the command it times."""
import json
import os

from helpers import ROOT, load_script

_script = load_script("bench_readme_command")


def _summary(logs, name, train_s, accuracy, measured=None, selected=149):
    path = os.path.join(logs, f"compare_{name}")
    os.makedirs(path)
    epochs = [{"test_accuracy": a, "selected": selected} for a in accuracy]
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"best_test_accuracy": max(accuracy), "train_time_s": train_s,
                   "measured_ratio": measured, "num_tensors": 149, "epochs": epochs}, f)


def test_a_finished_commands_logs_give_each_schemes_row_against_full_training(tmp_path):
    logs = str(tmp_path)
    _summary(logs, "full_training", 200.0, [50.0, 70.0, 80.0, 79.0])
    _summary(logs, "elastic_training", 100.0, [60.0, 70.0, 72.0, 74.0], 0.52, 63)
    _summary(logs, "traditional_tl_training", 40.0, [40.0, 50.0, 55.0, 58.0], None, 2)
    runs = _script.read_runs(logs)
    assert list(runs) == ["Full training", "ElasticTrainer", "Traditional TL"]
    elastic = runs["ElasticTrainer"]
    assert elastic["time_ratio"] == 0.5 and elastic["best"] == 74.0
    assert elastic["last"] == (70.0 + 72.0 + 74.0) / 3 and elastic["selected"] == 63
    results = [{"seed": 0, "command_s": 360.0, "setup_s": 120.0, "schemes": runs},
               {"seed": 1, "command_s": 420.0, "setup_s": None, "schemes": runs}]
    assert "| 0 | ElasticTrainer | 74.0% | 72.0% | 100.0 s | 0.50 | 0.52 | 63/149 |" in (
        _script.table(results))
    line = _script.summary_line(results)
    # 80 - 74 points under; full training's last two epochs 80 and 79: 1 point of spread
    assert "best 6.0 points under full training's (6.0 to 6.0) in 0.50" in line
    assert "moves by 1.0 points" in line and "took 6.5 min (6.0 to 7.0)" in line
    assert "set-up 2.0 min more" in line


def test_seeds_are_read_back_only_from_this_machine_and_this_command(tmp_path):
    out = str(tmp_path / "bench")
    machine = {"cpu": "AMD EPYC", "cores": 2, "tensorflow": "2.21.0", "platform": "a"}
    stored = {"command": _script.COMMAND, "machine": dict(machine, platform="b"),
              "results": [{"seed": 0}]}
    with open(out + ".json", "w") as f:
        json.dump(stored, f)
    assert _script.load(out, machine) == [{"seed": 0}]  # another kernel: the same machine
    assert _script.load(out, dict(machine, cores=4)) == []
    stored["command"] += " --rho 0.4"
    with open(out + ".json", "w") as f:
        json.dump(stored, f)
    assert _script.load(out, machine) == []


def test_the_readme_prints_the_command_it_times():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert f"{_script.SETUP} && .venv/bin/python {_script.COMMAND}\n" in readme
