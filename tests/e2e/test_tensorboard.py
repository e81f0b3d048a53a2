"""A small sweep (two rho and full training) and its profile, read back through a real
TensorBoard server's HTTP API: the runs, their scalars, the selection heat map image, the
HParams experiment with the runs' metrics, the config and closing text, and the Profile tab's
run."""
import gzip
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest
from PIL import Image

from elastictrainer import config, runlog
from elastictrainer.profiler import table as ptable


RUNS = {"elastic_rho0.6": ("elastic_training", 0.6), "elastic_rho0.8": ("elastic_training", 0.8),
        "full": ("full_training", 0.5)}
EPOCHS = 2


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """logs/ of three tiny runs and the profile they were timed with: (logs, their summaries).
    The profile is the `profile` command's default trace folder (logs/<table>_profile)."""
    from elastictrainer.profiler.run import profile_configuration
    from elastictrainer.runs import loop

    root = tmp_path_factory.mktemp("board")
    here = os.getcwd()
    os.chdir(root)  # the trace's default folder is relative, as for a user in their project
    try:
        _, table = profile_configuration(
            "smallcnn", input_size=16, batch_size=8, num_classes=10, num_iterations=2,
            warmup=1, output=str(root / "profiles" / "smallcnn.json"),
            progress=False, calibrate=False, optimizer="adam")
    finally:
        os.chdir(here)
    # the runs are timed by a table of fixed times, so that what they select does not depend
    # on how busy the machine was while profiling: the forward pass a fifth of a step
    fixed = json.load(open(table))
    n = len(fixed["tensors"])
    fixed.update(t_full_ms=10.0, t_fp_ms=2.0, t_bp_ms=8.0, t_grads_ms=None, calibration=None)
    for t in fixed["tensors"]:
        t.update(t_dw_ms=4.8 / n, t_dy_ms=3.2 / n)
    table = str(root / "profiles" / "fixed.json")
    ptable.save_table(fixed, table)
    summaries = {}
    for name, (train_type, rho) in RUNS.items():
        cfg = config.Config(model_name="smallcnn", weights="none", dataset_name="synthetic",
                            input_size=16, batch_size=8, num_classes=10, num_epochs=EPOCHS,
                            steps_per_epoch=6, interval=1.0, train_type=train_type, rho=rho,
                            economy=False, optimizer="adam", learning_rate=0.003,
                            timing_table=table, logdir=str(root / "logs"), run_name=name,
                            progress=False)
        summaries[name] = loop.run(cfg, log=lambda msg: None)
    return root / "logs", summaries


class Board:
    """A `tensorboard` over `logdir` on a localhost port of its own choosing (--port 0; the
    port it bound is read from the line it prints: a port picked here and bound there could be
    taken in between by another test's server), stopped on exit."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.base = None
        self.said = []  # its stderr lines, read as they come so that the pipe never fills

    def __enter__(self):
        exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
        self.proc = subprocess.Popen([exe, "--logdir", str(self.logdir), "--host", "127.0.0.1",
                                      "--port", "0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 120
        while self.base is None:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.stderr()
            time.sleep(0.2)
        return self

    def _read(self):
        for line in iter(self.proc.stderr.readline, b""):
            text = line.decode(errors="replace")
            self.said.append(text)
            found = re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/", text)
            if found:
                self.base = found.group(1)

    def stderr(self):
        return "".join(self.said)[-2000:]

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def get(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            raw = r.read()
            # the profile plugin compresses its answers whatever the request accepts
            return gzip.decompress(raw) if r.headers.get("Content-Encoding") == "gzip" else raw

    def json(self, path, body=None):
        return json.loads(self.get(path, body))

    def until(self, path, ready, body=None, patience_s=60):
        """The JSON at `path` once `ready` holds for it (the server loads the logs at its own
        pace); what it last gave, if it never does."""
        got, deadline = None, time.monotonic() + patience_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stderr()
            try:
                got = self.json(path, body)
                if ready(got):
                    return got
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        return got


HPARAMS_QUERY = {"experimentName": "", "startIndex": 0, "sliceSize": 100, "colParams": [],
                 "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                     "STATUS_RUNNING"]}


def test_a_sweep_reads_back_through_a_real_tensorboard(sweep):
    logs, summaries = sweep
    with Board(logs) as tb:
        runs = tb.until("/data/runs", lambda r: set(RUNS) <= set(r))
        assert set(RUNS) <= set(runs), runs

        # the scalars: the reference's, the elastic ones, and the run-level metrics
        tags = tb.until("/data/plugin/scalars/tags", lambda t: set(RUNS) <= set(t))
        for name in RUNS:
            assert {runlog.TRAIN_ACCURACY, runlog.TEST_ACCURACY, runlog.BEST_ACCURACY,
                    runlog.TRAIN_TIME, runlog.TENSORS_TRAINED} <= set(tags[name]), name
        for name in ("elastic_rho0.6", "elastic_rho0.8"):
            assert {runlog.NUM_SELECTED, runlog.PREDICTED_RATIO, runlog.RUN_MEASURED_RATIO,
                    runlog.TIME_OVER_FULL} <= set(tags[name]), name

        # the heat map: one image per re-selection and one at the end, of the elastic runs
        images = tb.json("/data/plugin/images/tags")
        assert set(images) == {"elastic_rho0.6", "elastic_rho0.8"}
        for name in images:
            info = images[name][runlog.SELECTION_IMAGE]
            assert f"ρ asked {RUNS[name][1]:g}" in info["description"]
            assert "forward floor" in info["description"]
            query = urllib.parse.urlencode({"run": name, "tag": runlog.SELECTION_IMAGE,
                                            "sample": 0})
            points = tb.json(f"/data/plugin/images/images?{query}")
            sels = summaries[name]["selections"]
            assert [p["step"] for p in points] == [s["step"] for s in sels] + [6 * EPOCHS]
            picture = Image.open(io.BytesIO(tb.get(
                "/data/plugin/images/individualImage?" + points[-1]["query"])))
            width, height = picture.size
            # the figure's 7.5 x 5 inches at 100 dpi, give or take its legends and margins
            assert 650 <= width <= 900 and 420 <= height <= 560, picture.size
            pixels = np.asarray(picture.convert("L"))
            assert (pixels < 60).mean() > 0.05  # trained tensors are drawn dark

        # HParams: the sweep's three sessions, their settings and metrics
        experiment = tb.until("/data/plugin/hparams/experiment", lambda e: e.get("hparamInfos"),
                              body={"experimentName": ""})
        infos = {h["name"]: h for h in experiment["hparamInfos"]}
        assert set(infos["train_type"]["domainDiscrete"]) == {"elastic_training",
                                                             "full_training"}
        assert infos["rho"]["domainInterval"] == {"minValue": 0.6, "maxValue": 0.8}
        assert {"model_name", "dataset_name", "input_size", "batch_size", "optimizer",
                "learning_rate", "seed", "cache_frozen_prefix"} <= set(infos)
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert {runlog.BEST_ACCURACY, runlog.TRAIN_TIME, runlog.TIME_OVER_FULL,
                runlog.RUN_MEASURED_RATIO, runlog.TENSORS_TRAINED} <= metrics
        groups = tb.json("/data/plugin/hparams/session_groups", HPARAMS_QUERY)["sessionGroups"]
        by_run = {g["sessions"][0]["name"]: g for g in groups}
        assert set(by_run) == set(RUNS)
        for name, (train_type, rho) in RUNS.items():
            group, summary = by_run[name], summaries[name]
            assert group["hparams"]["train_type"] == train_type
            assert group["hparams"].get("rho") == (rho if train_type != "full_training" else None)
            values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
            assert values[runlog.BEST_ACCURACY] == pytest.approx(summary["best_test_accuracy"])
            assert values[runlog.TRAIN_TIME] == pytest.approx(summary["train_time_s"], rel=1e-6)
            if train_type == "full_training":
                assert values[runlog.TIME_OVER_FULL] == 1.0
                assert values[runlog.TENSORS_TRAINED] == summary["num_tensors"]
            else:
                assert values[runlog.RUN_MEASURED_RATIO] == pytest.approx(
                    summary["measured_ratio"], rel=1e-6)
                assert 0 < values[runlog.TENSORS_TRAINED] < summary["num_tensors"]

        # the config and the closing line
        texts = tb.json("/data/plugin/text/tags")
        for name in RUNS:
            assert {runlog.CONFIG_TEXT, runlog.RESULT_TEXT} <= set(texts[name])
        query = urllib.parse.urlencode({"run": "elastic_rho0.6", "tag": runlog.RESULT_TEXT})
        closing = tb.json(f"/data/plugin/text/text?{query}")[0]["text"]
        assert "asked 0.6, measured" in closing and "of full training" in closing
        assert "Tensors trained" in closing

        # the Profile tab: the profiler's trace kept beside the runs
        profiles = tb.until("/data/plugin/profile/runs", lambda r: bool(r))
        assert any(r.startswith("smallcnn_profile") for r in profiles), profiles
