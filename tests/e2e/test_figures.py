"""The smoke figure end to end: the real figure script, profiler, training and plots on
synthetic data, then run again without training anything; and the same figure through
`--ray local`, whose run must end with the same files.  Its ElasticTrainer run only (`--ego`):
a baseline is the same `elastictrainer train` process with another --train_type
(integration/test_train.py trains each), the figure's plan with its baselines is
unit/test_figures.py's and the tables beside full training are unit/test_plot.py's."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, TRAIN_COMMAND as TRAIN


SCRIPT = os.path.join(ROOT, "scripts", "run_figure15.sh")
FIGURES = ("fig15_ego.png", "fig15_ego.pdf", "fig15_ego_bars.png", "fig15_ego_bars.pdf",
           "fig15_ego_bars.md", "fig15_ego_profile.png", "fig15_ego_profile.pdf")


def smoke_args(root):
    # a quick check of the pipeline: each epoch evaluated on 64 test images, not the protocol's
    # 1024, which would cost more than the steps
    return ["--ego", "--logdir", str(root / "logs"), "--figdir", str(root / "figs"),
            "--profiles", str(root / "profiles"), "--steps_per_epoch", "6", "--num_test", "64"]


def smoke_env(root):
    # its own Keras home: the smoke runs pretrain smallcnn at 64 px, and a test must not write
    # the user's ~/.keras cache (nor a cluster node's working folders to the user's ~/.cache)
    # and this interpreter, wherever the clone's own .venv is
    return dict(os.environ, SMOKE="1", KERAS_HOME=str(root / "keras_home"),
                XDG_CACHE_HOME=str(root / "cache"), PYTHON=sys.executable)


@pytest.fixture(scope="module")
def serial_smoke(tmp_path_factory):
    """The smoke figure, run once by the serial driver: (folder, its output)."""
    root = tmp_path_factory.mktemp("serial")
    out = subprocess.run(["bash", SCRIPT] + smoke_args(root), capture_output=True, text=True,
                         env=smoke_env(root), timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return root, out


def tree(root):
    """Every file under the runs, figures and tables, as a path relative to `root`; the names
    that hold a time, a host or a process id (event files, profiler traces) are masked."""
    files = set()
    for folder in ("logs", "figs", "profiles"):
        for base, _, names in os.walk(root / folder):
            for name in names:
                rel = os.path.relpath(os.path.join(base, name), root)
                rel = re.sub(r"tfevents\..*$", "tfevents.*", rel)
                files.add(re.sub(r"plugins/profile/[^/]+/[^/]+$", "plugins/profile/*", rel))
    return files


def run_names(root):
    """The run directories under the figure's logs (the profiler's trace folder is not one)."""
    return [r for r in os.listdir(root / "logs") if (root / "logs" / r / "summary.json").exists()]


def test_smoke_figure_end_to_end_then_resumes_without_rerunning(serial_smoke):
    """The smoke figure: the real script, profiler (its trace beside the run), the pretraining
    of --weights synthetic, the run and the plots on synthetic data."""
    root, _ = serial_smoke
    assert list((root / "keras_home" / "models").glob("elastictrainer_synthetic_smallcnn_*"))
    for name in FIGURES:
        path = root / "figs" / name
        assert path.exists(), name
        assert path.stat().st_size > (0 if name.endswith(".md") else 1000), name
    table = (root / "figs" / "fig15_ego_bars.md").read_text()
    assert "| smallcnn | synthetic | ElasticTrainer | 0.5 | 1 |" in table
    runs = run_names(root)
    assert len(runs) == 1 and runs[0].startswith("smallcnn_synthetic_elastic_training_")
    # the profiler's trace beside the runs, where TensorBoard's Profile tab finds it
    assert list((root / "logs").glob("smallcnn_*_profile/plugins/profile/*/*.xplane.pb"))
    # run again: every run is found finished and only the figures are redrawn
    again = subprocess.run(["bash", SCRIPT] + smoke_args(root), capture_output=True, text=True,
                           env=smoke_env(root), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("not run again") == 1 and TRAIN not in again.stdout


def test_the_smoke_figure_on_a_local_ray_instance_ends_as_the_serial_one(serial_smoke,
                                                                         tmp_path):
    """The serial figure's profile is copied here (its table and trace), so the sweep on Ray
    trains its run (which reads the copied timing table on its node) and draws the figures;
    the folder it leaves is the serial one's.  Ray's scheduling, retries and resume are
    integration/test_cluster.py's, with a stand-in command."""
    pytest.importorskip("ray", reason="the cluster extra: pip install -e '.[cluster]'")
    serial, _ = serial_smoke
    # the serial figure's pretrained smallcnn (the serial test checks the pretraining itself):
    # the run compared starts from the same weights, and the pretraining is not paid twice
    for folder in ("keras_home", "profiles"):
        shutil.copytree(serial / folder, tmp_path / folder)
    # and the profiler's trace beside the runs, which the copied table stands for
    elastic, = run_names(serial)
    shutil.copytree(serial / "logs", tmp_path / "logs", ignore=lambda base, names: [
        n for n in names if n == elastic])
    out = subprocess.run([sys.executable, "-m", "elastictrainer", "figure", "15", "--smoke",
                          "--ray", "local"] + smoke_args(tmp_path), capture_output=True,
                         text=True, env=smoke_env(tmp_path), timeout=900, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the run was a Ray task: it ran in a working folder of its node, not in --logdir
    assert out.stdout.count("finished on ") == 1 and "not run again" not in out.stdout
    assert tree(tmp_path) == tree(serial)
    ray_summary = json.loads((tmp_path / "logs" / elastic / "summary.json").read_text())
    serial_summary = json.loads((serial / "logs" / elastic / "summary.json").read_text())
    assert ray_summary["status"] == "finished"
    # the same command: the same scheme, model, seed, steps and epochs
    for key in ("train_type", "model", "seed", "steps_per_epoch", "tensor_names"):
        assert ray_summary[key] == serial_summary[key], key
    assert len(ray_summary["epochs"]) == len(serial_summary["epochs"]) == 12
    # the figures were drawn here from the directories that came back
    assert (tmp_path / "figs" / "fig15_ego_bars.md").read_text().count("| smallcnn |") == 1
