"""Bad input is one line on stderr and exit code 2, never a traceback: checked once per program
as the user runs it, `python main.py` and `python profiler.py` in a subprocess, with input found
bad only after TensorFlow started, so that nothing TensorFlow says on the way reaches stderr.

Which inputs are refused, and how, is checked in-process: the settings and flags in
unit/test_train.py, unit/test_config.py and unit/test_profiler.py, folders in
unit/test_data.py, timing tables in integration/test_profiler.py, a run meeting bad images in
integration/test_errors.py."""
import json
import os
import subprocess
import sys

from helpers import ROOT, run_profiler_cli, scripted_table, tiny_model


def assert_one_line(r, code, needle):
    assert r.returncode == code, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], lines


def test_main_py_refuses_a_timing_table_with_a_value_out_of_range_in_one_line(tmp_path):
    # the table is read after the data loaded and the model was built: TensorFlow has started
    model = tiny_model()
    model.save(str(tmp_path / "tiny.keras"))
    path = scripted_table(model, tmp_path / "bad.json", input_size=16, batch_size=4,
                          optimizer="sgd")
    with open(path) as f:
        bad = json.load(f)
    bad["t_full_ms"] = 0.0
    with open(path, "w") as f:
        json.dump(bad, f)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"),
                        "--model_name", str(tmp_path / "tiny.keras"), "--weights", "none",
                        "--dataset_name", "synthetic", "--input_size", "16", "--batch_size", "4",
                        "--num_epochs", "1", "--quiet", "--timing_table", path,
                        "--logdir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=600)
    assert_one_line(r, 2, "t_full_ms 0.0")


def test_profiler_py_refuses_an_unknown_model_in_one_line(tmp_path):
    # the model's name is looked up as it is built, after TensorFlow was imported
    r = run_profiler_cli(["--model_name", "resnet51"], cwd=str(tmp_path))
    assert_one_line(r, 2, "resnet50")
