"""Fig. 15's and 17's curves mark where each scheme first reaches the time-to-accuracy levels
(95% and 99% of full training's best, within 1 point of it): the marks' positions, read from
the drawn figure's lines, on run directories with scripted summaries."""
import os

from elastictrainer import runlog
from elastictrainer.plotting import curves
from elastictrainer.plotting.common import time_unit

SPE = 10


def scripted_run(root, name, train_type, accs, epoch_s, dataset="caltech_birds2011", rho=None):
    """A finished run's config.json and summary.json (no events: the curves read the epochs)."""
    d = os.path.join(str(root), name)
    os.makedirs(d)
    runlog.write_json(os.path.join(d, runlog.CONFIG_FILE), {
        "model_name": "mobilenetv2", "dataset_name": dataset, "train_type": train_type,
        "rho": 0.5 if rho is None else rho, "seed": 0, "num_epochs": 4})
    runlog.write_json(os.path.join(d, runlog.SUMMARY_FILE), {
        "train_type": train_type, "model": "mobilenetv2", "dataset": dataset, "rho": rho,
        "seed": 0, "steps_per_epoch": SPE, "status": "finished", "best_test_accuracy": max(accs),
        "train_time_s": len(accs) * epoch_s, "selections": [],
        "epochs": [{"epoch": k, "train_time_s": k * epoch_s, "test_accuracy": a,
                    "train_loss": 1.0 / k} for k, a in enumerate(accs, start=1)]})
    return d


def drawn_marks(run_dirs, tmp_path, monkeypatch):
    """{(level, scheme label): (x, y)} of the level marks plot_curves draws, and the figure."""
    drawn = []
    monkeypatch.setattr(curves, "save_figure", lambda fig, out: drawn.append(fig) or [out])
    curves.plot_curves(run_dirs, str(tmp_path / "curves"))
    fig = drawn[0]
    marks = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_gid():
                level, label = line.get_gid().split("|")
                marks[level, label, ax.get_title()] = (line.get_xdata()[0], line.get_ydata()[0])
    return marks, fig


def test_marks_where_each_scheme_first_reaches_each_level(tmp_path, monkeypatch):
    # full training's best is 81: 95% of it 76.95, 99% 80.19, within 1 point 80.0
    runs = [scripted_run(tmp_path, "full", "full_training", (60.0, 75.0, 80.0, 81.0), 100.0),
            scripted_run(tmp_path, "et", "elastic_training", (70.0, 77.0, 79.0, 80.1), 50.0,
                         rho=0.4),
            scripted_run(tmp_path, "tl", "traditional_tl_training", (40.0, 45.0, 50.0, 52.0),
                         25.0),
            # another panel, whose own full training sets its levels (best 50: 47.5, 49.5, 49)
            scripted_run(tmp_path, "full_pet", "full_training", (30.0, 50.0), 100.0,
                         dataset="oxford_iiit_pet"),
            scripted_run(tmp_path, "et_pet", "elastic_training", (49.2, 49.6), 50.0,
                         dataset="oxford_iiit_pet", rho=0.4)]
    marks, fig = drawn_marks(runs, tmp_path, monkeypatch)
    scale, _ = time_unit(400.0)
    birds, pet = "caltech_birds2011", "oxford_iiit_pet"
    assert marks == {
        ("p95", "Full training", birds): (300 / scale, 80.0),
        ("p99", "Full training", birds): (400 / scale, 81.0),
        ("pt1", "Full training", birds): (300 / scale, 80.0),
        ("p95", "ElasticTrainer (ρ=0.4)", birds): (100 / scale, 77.0),
        ("pt1", "ElasticTrainer (ρ=0.4)", birds): (200 / scale, 80.1),  # 99% never reached
        # traditional TL reaches no level: no mark
        ("p95", "Full training", pet): (200 / scale, 50.0),
        ("p99", "Full training", pet): (200 / scale, 50.0),
        ("pt1", "Full training", pet): (200 / scale, 50.0),
        ("p95", "ElasticTrainer (ρ=0.4)", pet): (50 / scale, 49.2),
        ("pt1", "ElasticTrainer (ρ=0.4)", pet): (50 / scale, 49.2),
        ("p99", "ElasticTrainer (ρ=0.4)", pet): (100 / scale, 49.6)}
    # each mark in its scheme's line colour, one shape per level, and the legend names them
    marks = [line for line in fig.axes[0].get_lines() if line.get_gid()]
    line_colours = {line.get_color() for line in fig.axes[0].get_lines() if not line.get_gid()}
    colours = {}
    for line in marks:
        colours.setdefault(line.get_gid().split("|")[1], set()).add(line.get_markeredgecolor())
    assert all(len(c) == 1 and c <= line_colours for c in colours.values())
    assert colours["Full training"] != colours["ElasticTrainer (ρ=0.4)"]
    assert {line.get_gid().split("|")[0]: line.get_marker() for line in marks} == {
        "p95": "v", "p99": "D", "pt1": "*"}
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "first at 95% of full's best" in texts and "first at within 1 point" in texts
    curves.pyplot().close(fig)


def test_no_full_training_no_marks(tmp_path, monkeypatch):
    runs = [scripted_run(tmp_path, "et", "elastic_training", (70.0, 77.0), 50.0, rho=0.4)]
    marks, fig = drawn_marks(runs, tmp_path, monkeypatch)
    assert marks == {}
    assert not any(t.get_text().startswith("first at") for t in fig.legends[0].get_texts())
    curves.pyplot().close(fig)
