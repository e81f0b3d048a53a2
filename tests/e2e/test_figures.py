"""The smoke figure end to end: the real figure script, profiler, trainings and plots on
synthetic data, then run again without training anything."""
import os
import subprocess

from helpers import ROOT, TRAIN_COMMAND as TRAIN


def test_smoke_figure_end_to_end_then_resumes_without_rerunning(tmp_path):
    """CI's smoke figure: the real script, profiler, trainings and plots on synthetic data."""
    args = ["--logdir", str(tmp_path / "logs"), "--figdir", str(tmp_path / "figs"),
            "--profiles", str(tmp_path / "profiles"), "--steps_per_epoch", "6"]
    # its own Keras home: the smoke runs pretrain smallcnn at 64 px, and a test must not write
    # the user's ~/.keras cache
    env = dict(os.environ, SMOKE="1", KERAS_HOME=str(tmp_path / "keras_home"))
    script = os.path.join(ROOT, "scripts", "run_figure15.sh")
    out = subprocess.run(["bash", script] + args, capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list((tmp_path / "keras_home" / "models").glob("elastictrainer_synthetic_smallcnn_*"))
    for name in ("fig15.png", "fig15.pdf", "fig15_bars.png", "fig15_bars.pdf", "fig15_bars.md",
                 "fig15_profile.png", "fig15_profile.pdf"):
        path = tmp_path / "figs" / name
        assert path.exists(), name
        assert path.stat().st_size > (0 if name.endswith(".md") else 1000), name
    table = (tmp_path / "figs" / "fig15_bars.md").read_text()
    for label in ("ElasticTrainer", "Full training", "Traditional TL", "BN+Bias"):
        assert label in table
    runs = sorted(os.listdir(tmp_path / "logs"))
    assert len(runs) == 4 and all(r.startswith("smallcnn_synthetic_") for r in runs)
    # run again: every run is found finished and only the figures are redrawn
    again = subprocess.run(["bash", script] + args, capture_output=True, text=True, env=env,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("not run again") == 4 and TRAIN not in again.stdout
