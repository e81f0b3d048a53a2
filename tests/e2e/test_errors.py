"""Bad input is one line and exit code 2, never a traceback; a run that dies says so."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from helpers import ROOT, tiny_model, write_image_folder
from elastictrainer import runlog
from elastictrainer.profiler import run as prun



def main_py(*args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def assert_one_line(r, code, needle):
    assert r.returncode == code, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], lines


SMALL = ["--model_name", "smallcnn", "--weights", "none", "--input_size", "16",
         "--batch_size", "4", "--num_epochs", "1", "--train_type", "full_training", "--quiet"]


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    d = tmp_path_factory.mktemp("table")
    model = tiny_model()
    model.save(str(d / "tiny.keras"))
    table = prun.profile_model(model, str(d / "tiny.keras"), 16, 4, 10, num_iterations=2,
                               progress=False, calibrate=False)
    return d, table


def test_an_image_folder_with_one_class(tmp_path):
    folder = write_image_folder(tmp_path / "one", classes=("cat",), per_class=8)
    r = main_py("--dataset_name", str(folder), "--logdir", str(tmp_path / "logs"), *SMALL)
    assert_one_line(r, 2, "a classifier needs at least two")


def test_a_file_that_is_not_an_image_is_skipped_and_counted(tmp_path):
    folder = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5)
    (folder / "a" / "broken.png").write_bytes(b"this is not a PNG")
    (folder / "b" / "empty.jpg").write_bytes(b"")
    r = main_py("--dataset_name", str(folder), "--logdir", str(tmp_path / "logs"),
                "--run_name", "r", *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "skipped 2 file(s)" in r.stdout and "broken.png" in r.stdout
    summary = json.load(open(tmp_path / "logs" / "r" / runlog.SUMMARY_FILE))
    assert summary["status"] == "finished" and summary["skipped_images"] == 2
    assert {os.path.basename(f) for f in summary["skipped_files"]} == {"broken.png", "empty.jpg"}


def test_a_truncated_image_stops_the_run_naming_the_file_and_the_summary_says_failed(tmp_path):
    folder = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5, fmt="png")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(
        buf, format="PNG")
    data = buf.getvalue()
    for name in ("a", "b"):  # one in each class, so that whatever the split, training meets one
        (folder / name / "truncated.png").write_bytes(data[: len(data) // 2])
    r = main_py("--dataset_name", str(folder), "--logdir", str(tmp_path / "logs"),
                "--run_name", "r", *SMALL)
    assert_one_line(r, 1, "truncated.png")
    summary = json.load(open(tmp_path / "logs" / "r" / runlog.SUMMARY_FILE))
    assert summary["status"] == "failed" and "truncated.png" in summary["error"]


@pytest.mark.parametrize("logdir,needle", [("/proc/x", "--logdir /proc/x: cannot write there"),
                                           ("FILE", "cannot write there")])
def test_an_unwritable_logdir_fails_before_training(tmp_path, logdir, needle):
    if logdir == "FILE":
        (tmp_path / "afile").write_text("x")
        logdir = str(tmp_path / "afile")
    r = main_py("--dataset_name", "synthetic", "--logdir", logdir, *SMALL)
    assert_one_line(r, 2, needle)


@pytest.mark.parametrize("edit,needle", [
    ({"t_full_ms": 0.0}, "t_full_ms 0.0"),
    ({"t_fp_ms": float("nan")}, "t_fp_ms nan"),
    ({"t_dw_ms": -1.0}, "t_dw_ms -1.0"),
    ({"t_dy_ms": float("nan")}, "t_dy_ms nan"),
])
def test_a_timing_table_with_values_out_of_range(tmp_path, tiny_table, edit, needle):
    d, table = tiny_table
    bad = json.loads(json.dumps(table))
    for key, value in edit.items():
        (bad["tensors"][0] if key in ("t_dw_ms", "t_dy_ms") else bad)[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = main_py("--model_name", str(d / "tiny.keras"), "--dataset_name", "synthetic",
                "--input_size", "16", "--weights", "none", "--num_epochs", "1", "--quiet",
                "--timing_table", str(path), "--logdir", str(tmp_path / "logs"))
    assert_one_line(r, 2, needle)
