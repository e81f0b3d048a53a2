"""A run that meets bad data, in this process through main.py's entry point: files that are not
images are skipped, counted and named, and the run finishes; a truncated image stops the run in
one stderr line naming the file, with exit code 1, and summary.json says failed.  A run
interrupted here (Ctrl-C) says so in its last line.

That main.py itself turns an error into one stderr line and its exit code, with nothing else
on stderr, is tests/e2e/test_errors.py's."""
import io
import json
import os

import numpy as np
from PIL import Image

from elastictrainer import runlog
from helpers import script_cli, write_image_folder

SMALL = ["--model_name", "smallcnn", "--weights", "none", "--input_size", "16",
         "--batch_size", "4", "--num_epochs", "1", "--train_type", "full_training", "--quiet"]


def _summary(logdir, run):
    with open(os.path.join(logdir, run, runlog.SUMMARY_FILE)) as f:
        return json.load(f)


def test_a_file_that_is_not_an_image_is_skipped_and_counted(tmp_path, capsys):
    folder = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5)
    (folder / "a" / "broken.png").write_bytes(b"this is not a PNG")
    (folder / "b" / "empty.jpg").write_bytes(b"")
    code, out, err = script_cli("main", ["--dataset_name", str(folder), "--logdir",
                                         str(tmp_path / "logs"), "--run_name", "r", *SMALL],
                                capsys)
    assert code == 0, err
    assert "skipped 2 file(s)" in out and "broken.png" in out
    summary = _summary(tmp_path / "logs", "r")
    assert summary["status"] == "finished" and summary["skipped_images"] == 2
    assert {os.path.basename(f) for f in summary["skipped_files"]} == {"broken.png", "empty.jpg"}


def test_a_truncated_image_stops_the_run_naming_the_file_and_the_summary_says_failed(
        tmp_path, capfd):
    folder = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5, fmt="png")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(
        buf, format="PNG")
    data = buf.getvalue()
    for name in ("a", "b"):  # one in each class, so that whatever the split, training meets one
        (folder / name / "truncated.png").write_bytes(data[: len(data) // 2])
    # capfd, not capsys: what TensorFlow's C++ side says about the failed decode goes to the
    # process's stderr, which must still hold the one line
    code, _, err = script_cli("main", ["--dataset_name", str(folder), "--logdir",
                                       str(tmp_path / "logs"), "--run_name", "r", *SMALL], capfd)
    assert code == 1 and len(err) == 1 and "truncated.png" in err[0], err
    summary = _summary(tmp_path / "logs", "r")
    assert summary["status"] == "failed" and "truncated.png" in summary["error"]


def test_an_interrupted_run_says_so_in_its_last_line(tmp_path):
    from elastictrainer import config
    from elastictrainer.runs import loop

    lines = []

    def log(msg):
        lines.append(msg)
        if msg.startswith("epoch 1:"):
            os.kill(os.getpid(), 2)  # SIGINT, as Ctrl-C

    cfg = config.Config(model_name="smallcnn", dataset_name="synthetic", input_size=16,
                        batch_size=8, weights="none", num_epochs=3, steps_per_epoch=3,
                        train_type="full_training", logdir=str(tmp_path), run_name="r",
                        progress=False)
    assert loop.run(cfg, log=log)["status"] == "interrupted"
    assert "interrupted after 1 of 3 epochs" in lines[-1]
