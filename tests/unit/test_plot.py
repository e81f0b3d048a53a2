"""plot.py / plotting.py on fake run directories (real event files); a real tiny run is
integration/test_plot.py's."""
import json
import os

import numpy as np
import pytest

import tensorflow as tf

from elastictrainer import plotting
from elastictrainer import runlog
from helpers import assert_figures, plot_cli as cli

SPE = 250  # steps per epoch of the fake runs


def make_run(root, name, model="resnet50", dataset="caltech_birds2011", train_type="full_training",
             rho=None, seed=0, epoch_s=900.0, accs=(40.0, 55.0, 61.0, 63.0), status="finished",
             masks=None, selections_in_summary=True, n_tensors=6, num_epochs=4, energy_w=None,
             **settings):
    """A run directory as loop.run() writes it: config.json, summary.json and event files.

    Epoch k ends at step k*SPE after k*epoch_s seconds; the training loss is logged every 200
    steps and at each epoch end; `masks` (elastic runs) are re-selected every half epoch.
    """
    d = os.path.join(str(root), name)
    os.makedirs(d)
    runlog.write_json(os.path.join(d, runlog.CONFIG_FILE), {
        "model_name": model, "dataset_name": dataset, "train_type": train_type,
        "rho": 0.5 if rho is None else rho, "seed": seed, "num_epochs": num_epochs,
        "interval": 0.5, "learning_rate": 1e-4, "optimizer": "sgd", **settings})
    epochs, selections = [], []
    writer = tf.summary.create_file_writer(d)
    with writer.as_default():
        for i, m in enumerate(masks or []):
            step = i * SPE // 2
            ratio = 0.1 + 0.1 * sum(m)
            selections.append({"step": step, "epoch": step / SPE, "mask": list(m),
                               "predicted_ratio": ratio, "importance_ms": 1.0, "solve_ms": 1.0,
                               "importance": [0.0] * len(m),
                               "measured_ratio": None if i == 0 else ratio + 0.01})
            tf.summary.scalar(runlog.NUM_SELECTED, sum(m), step=step)
            tf.summary.scalar(runlog.PREDICTED_RATIO, ratio, step=step)
            tf.summary.write(runlog.SELECTION_MASK, tf.constant(np.array(m, np.int32)), step=step)
        for k, acc in enumerate(accs, start=1):
            for step in range((k - 1) * SPE + 1, k * SPE + 1):
                if step % 200 == 0 or step == k * SPE:
                    tf.summary.scalar(runlog.TRAIN_LOSS, 3.0 / (1 + step / 100) + seed * 0.01,
                                      step=step)
            tf.summary.scalar(runlog.TEST_ACCURACY, acc, step=k * SPE)
            tf.summary.scalar(runlog.TEST_LOSS, 1.0, step=k * SPE)
            epochs.append({"epoch": k, "train_time_s": k * epoch_s, "test_accuracy": acc,
                           "test_loss": 1.0, "train_accuracy": acc, "train_loss": 1.0,
                           "selected": n_tensors})
    writer.close()
    runlog.write_json(os.path.join(d, runlog.SUMMARY_FILE), {
        "train_type": train_type, "model": model, "dataset": dataset, "rho": rho, "seed": seed,
        "num_tensors": n_tensors, "tensor_names": [f"t{i}" for i in range(n_tensors)],
        "timing_table": None, "steps_per_epoch": SPE, "status": status,
        "best_test_accuracy": max(accs) if accs else None, "train_time_s": len(accs) * epoch_s,
        "epochs": epochs, "selections": selections if selections_in_summary else [],
        "energy_j": energy_w * len(accs) * epoch_s if energy_w else None,
        "avg_power_w": energy_w, "energy_source": "test rail" if energy_w else "no sensor: test"})
    return d


MASKS = [[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 1, 0, 0, 1, 1],
         [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 1], [0, 0, 1, 0, 1, 1]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2 datasets x 3 schemes x 2 seeds of resnet50, plus vit runs, an elastic run at another
    rho and a run still going."""
    root = tmp_path_factory.mktemp("fake_runs")
    out = {}
    for dataset in ("caltech_birds2011", "oxford_iiit_pet"):
        for seed in (0, 1):
            out[("full", dataset, seed)] = make_run(
                root, f"r50_{dataset}_full_s{seed}", dataset=dataset, seed=seed,
                epoch_s=900.0 + 100 * seed)
            out[("tl", dataset, seed)] = make_run(
                root, f"r50_{dataset}_tl_s{seed}", dataset=dataset, seed=seed,
                train_type="traditional_tl_training", epoch_s=300.0,
                accs=(20.0, 25.0 + seed, 27.0 + 2 * seed, 28.0))
            out[("elastic", dataset, seed)] = make_run(
                root, f"r50_{dataset}_et_s{seed}", dataset=dataset, seed=seed,
                train_type="elastic_training", rho=0.4, epoch_s=475.0,
                accs=(38.0, 54.0, 60.0, 62.0 + seed), masks=MASKS)
    out["elastic0.6"] = make_run(root, "r50_cub_et06", train_type="elastic_training", rho=0.6,
                                 epoch_s=600.0, accs=(39.0, 55.0, 61.0, 62.5), masks=MASKS)
    out["running"] = make_run(root, "r50_cub_bn_running", train_type="bn_plus_bias_training",
                              epoch_s=500.0, accs=(30.0, 41.0), status="running")
    out["vit_full"] = make_run(root, "vit_full", model="vit", epoch_s=1200.0)
    out["vit_et"] = make_run(root, "vit_et", model="vit", train_type="elastic_training", rho=0.5,
                             epoch_s=800.0, masks=MASKS)
    out["root"] = str(root)
    return out


# ----------------------------------------------------------------- pure pieces
def test_step_to_time_interpolates_between_epoch_ends():
    epochs = [{"epoch": 1, "train_time_s": 100.0}, {"epoch": 2, "train_time_s": 300.0}]
    t = plotting.step_to_time([0, 5, 10, 15, 20, 25], 10, epochs)
    np.testing.assert_allclose(t, [0, 50, 100, 200, 300, 400])  # 25: past the last epoch end
    assert np.isnan(plotting.step_to_time([5], 10, [])).all()


def test_time_unit_is_seconds_minutes_or_hours_as_the_runs_are_long():
    assert plotting.time_unit(119.0) == (1.0, "s")
    assert plotting.time_unit(120.0) == (60.0, "min")
    assert plotting.time_unit(7199.0) == (60.0, "min")
    assert plotting.time_unit(7200.0) == (3600.0, "h")


def test_labels_colors_and_legend_order():
    K = plotting.SchemeKey
    keys = [K("prunetrain", None), K("full_training", None), K("elastic_training", 0.6),
            K("bn_plus_bias_training", None), K("traditional_tl_training", None),
            K("elastic_training", 0.4), K("elastic_training_weight_magnitude", 0.4)]
    styles = plotting.scheme_styles(keys)
    order = [styles[k].label for k in sorted(keys, key=lambda k: styles[k].rank)]
    assert order == ["ElasticTrainer (ρ=0.4)", "ElasticTrainer (ρ=0.6)",
                     "ElasticTrainer |w| (ρ=0.4)", "Full training", "Traditional TL", "BN+Bias",
                     "PruneTrain"]
    assert len({s.color for s in styles.values()}) == len(keys)
    # a baseline keeps its color whatever else is plotted
    alone = plotting.scheme_styles([K("full_training", None)])
    assert alone[K("full_training", None)].color == styles[K("full_training", None)].color


def test_run_curves_reads_events_and_maps_them_to_training_time(runs):
    run = plotting.Run(runs[("full", "caltech_birds2011", 1)])
    c = plotting.run_curves(run)
    assert sorted(c["accuracy"]) == [250, 500, 750, 1000]
    assert c["accuracy"][500] == pytest.approx((2000.0, 55.0))  # 2 epochs of 1000 s
    assert c["loss"][200][0] == pytest.approx(800.0)  # 200 of 250 steps into epoch 1
    assert c["loss"][600][0] == pytest.approx(2400.0)
    assert c["loss"][200][1] == pytest.approx(3.0 / 3 + 0.01, rel=1e-6)


# ----------------------------------------------------------------- subcommands
def test_curves_writes_png_and_pdf(runs, tmp_path, capsys):
    dirs = [runs[k] for k in runs if isinstance(k, tuple)] + [runs["elastic0.6"], runs["running"]]
    code, out, err = cli(["curves", *dirs, "--out", str(tmp_path / "figs" / "fig15")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "figs" / "fig15"))
    assert "fig15.png" in out


def test_bars_averages_seeds_and_table_has_speedups(runs, tmp_path, capsys):
    dirs = [runs[("full", "caltech_birds2011", s)] for s in (0, 1)] + \
           [runs[("elastic", "caltech_birds2011", s)] for s in (0, 1)] + \
           [runs[("tl", "caltech_birds2011", s)] for s in (0, 1)] + \
           [runs["running"], runs["vit_et"], runs["vit_full"]]
    code, out, err = cli(["bars", *dirs, "--out", str(tmp_path / "fig19.png")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "fig19"))
    md = open(tmp_path / "fig19.md").read()
    assert md in out  # the same table is printed
    rows = {}
    for line in md.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[2])] = cells
    # resnet50 full: seeds take 3600 s and 4000 s -> 3800 s; elastic 1900 s -> 2.00x; the
    # longest run (4800 s) is under 2 h, so the table is in minutes
    assert "| training time (min) |" in md.splitlines()[0]
    full = rows[("resnet50", "Full training")]
    assert full[4] == "2" and float(full[6]) == pytest.approx(3800 / 60, rel=1e-2)
    assert full[7] == "1.00x"
    et = rows[("resnet50", "ElasticTrainer")]
    assert et[3] == "0.4" and float(et[5]) == pytest.approx(62.5) and et[7] == "2.00x"
    assert rows[("resnet50", "Traditional TL")][7] == "3.17x"  # 3800 / 1200
    assert rows[("resnet50", "BN+Bias (unfinished)")][7] == "3.80x"  # 3800 / 1000
    assert rows[("vit", "ElasticTrainer")][7] == "1.50x"  # 4800 / 3200
    groups = plotting.bar_groups([plotting.Run(d) for d in dirs])
    et_group = next(g for g in groups if g.model == "resnet50" and g.key.rho == 0.4)
    assert sorted(et_group.accuracy) == [62.0, 63.0] and len(et_group.runs) == 2


def test_runs_that_differ_in_a_setting_are_never_averaged(tmp_path, capsys):
    """Runs that mix optimizers or learning rates are separate bars, not one average."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root, f"sgd_{seed}", seed=seed, epoch_s=25.0)
        make_run(root, f"adam_{seed}", seed=seed, epoch_s=20.0, accs=(50.0, 70.0),
                 optimizer="adam", learning_rate=3e-3)
    make_run(root, "adam_et", train_type="elastic_training", rho=0.5, epoch_s=10.0,
             accs=(50.0, 66.0), optimizer="adam", learning_rate=3e-3)
    code, out, err = cli(["bars", str(root), "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert any("differ in learning_rate, optimizer" in line for line in err)
    md = open(tmp_path / "b.md").read().splitlines()
    assert "| settings | seeds |" in md[0] and "(s)" in md[0]  # 100 s at most: seconds
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:]]
    full = {r[4]: r for r in rows if r[2] == "Full training"}
    assert set(full) == {"learning_rate=0.0001, optimizer=sgd",
                         "learning_rate=0.003, optimizer=adam"}
    assert full["learning_rate=0.003, optimizer=adam"][5] == "2"  # two seeds, one bar
    assert float(full["learning_rate=0.003, optimizer=adam"][6]) == pytest.approx(70.0)
    # the speedup compares with full training of the same settings: 40 s / 20 s
    et = next(r for r in rows if r[2] == "ElasticTrainer")
    assert et[-1] == "2.00x"
    runs = plotting.load_runs([str(root)], warn=lambda msg: None)
    label = plotting.common._legend_label(plotting.Style("Full training", None, 0), None,
                                   [r for r in runs if r.summary["seed"] in (0, 1)
                                    and r.variant[1][1] == "adam"
                                    and r.train_type == "full_training"])
    assert label == "Full training; 2 seeds"


def test_a_directory_of_run_directories_is_searched(runs, tmp_path, capsys):
    """`plot.py bars logs/*` works when one of the paths is a folder of runs (logs/smoke, say)."""
    code, out, err = cli(["bars", runs["root"], "--out", str(tmp_path / "all")], capsys)
    assert code == 0, err
    assert len(open(tmp_path / "all.md").read().splitlines()) > 6
    (tmp_path / "empty").mkdir()
    code, out, err = cli(["bars", str(tmp_path / "empty")], capsys)
    assert code == 2 and "no summary.json in it or below it" in err[0]
    # what the commands write beside the runs in --logdir, as `logs/*` expands it: skipped
    table = tmp_path / "cmp_compare.md"
    table.write_text("| scheme |\n")
    trace = tmp_path / "t_i32_b8_c3_profile" / "plugins" / "profile" / "2026_12_07"
    trace.mkdir(parents=True)
    given = [runs["elastic0.6"], str(table), str(trace.parents[2])]
    code, out, err = cli(["bars", *given, "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert [line for line in err if line.startswith("note: skipped")] == [
        f"note: skipped {p}: not a run directory (a table compare wrote, or a profile's trace)"
        for p in given[1:]]
    code, out, err = cli(["bars", str(table)], capsys)
    assert code == 2 and err[-1] == (f"error: no run directory among {table}: not a run "
                                     f"directory (a table compare wrote, or a profile's trace)")


def test_bars_without_full_run_leaves_speedup_blank(runs, tmp_path, capsys):
    code, out, err = cli(["bars", runs["elastic0.6"], "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    row = open(tmp_path / "b.md").read().splitlines()[2]
    assert row.rstrip().endswith("|  |")


def test_selection_matrix_from_summary_and_from_events_agree(runs, tmp_path):
    run = plotting.Run(runs[("elastic", "caltech_birds2011", 0)])
    sel = plotting.selection_matrix(run)
    assert sel.source == runlog.SUMMARY_FILE
    np.testing.assert_array_equal(sel.matrix, np.array(MASKS).T)  # [tensor, re-selection]
    np.testing.assert_allclose(sel.epochs, np.arange(8) * 0.5)
    bare = plotting.Run(make_run(tmp_path, "no_sel_in_summary", train_type="elastic_training",
                                 rho=0.4, masks=MASKS, selections_in_summary=False))
    ev = plotting.selection_matrix(bare)
    assert ev.source == "events"
    np.testing.assert_array_equal(ev.matrix, sel.matrix)
    np.testing.assert_allclose(ev.epochs, sel.epochs)
    np.testing.assert_allclose(ev.predicted_ratio, sel.predicted_ratio, rtol=1e-6)
    # what the steps took, from the summary only; unmeasured stays NaN, not 0
    assert np.isnan(sel.measured_ratio[0]) and np.all(np.isnan(ev.measured_ratio))
    np.testing.assert_allclose(sel.measured_ratio[1:], sel.predicted_ratio[1:] + 0.01)


def test_selection_writes_png_and_pdf(runs, tmp_path, capsys):
    code, out, err = cli(["selection", runs["vit_et"], "--out", str(tmp_path / "fig21")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "fig21"))


def test_profile_draws_a_timing_table(tmp_path, capsys):
    table = {"model": "tiny", "input_size": 16, "batch_size": 4, "num_classes": 10,
             "t_fp_ms": 2.0, "t_bp_ms": 4.0, "t_full_ms": 6.0, "coverage": 1.0,
             "unattributed": [],
             "tensors": [{"name": f"t{i}", "t_dw_ms": 0.5 + i, "t_dy_ms": 0.2, "estimated": i == 0,
                          "rank": 3 - i} for i in range(4)]}
    path = tmp_path / "tiny_table.json"
    path.write_text(json.dumps(table))
    code, out, err = cli(["profile", str(path), "--out", str(tmp_path / "prof")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "prof"))


# ----------------------------------------------------------------- bad input
def test_bad_input_one_line_exit_2(runs, tmp_path, capsys):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    cases = [
        (["curves", runs[("full", "caltech_birds2011", 0)], str(empty)], "not_a_run"),
        (["bars", str(tmp_path / "missing")], "missing"),
        (["selection", runs[("full", "caltech_birds2011", 0)]], "not an elastic"),
        (["curves"], "RUN_DIR"),
        (["profile", str(tmp_path / "nope.json")], "nope.json"),
    ]
    for argv, needle in cases:
        code, _, err = cli(argv + ["--out", str(tmp_path / "x")], capsys)
        assert code == 2 and len(err) == 1 and needle in err[0], (argv, err)
    assert not os.path.exists(tmp_path / "x.png")


def test_plotting_reads_events_without_starting_tensorflow(runs, tmp_path):
    import subprocess
    import sys

    out = str(tmp_path / "c")
    code = ("import sys\nfrom elastictrainer import cli\n"
            f"cli.plot_main(['curves', {runs['elastic0.6']!r}, '--out', {out!r}])\n"
            f"cli.plot_main(['selection', {runs['elastic0.6']!r}, '--out', {out + 's'!r}])\n"
            "assert 'tensorflow' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_figures(out)
    assert_figures(out + "s")


def test_energy_draws_measured_runs_and_says_which_were_left_out(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root, f"full_{seed}", seed=seed, epoch_s=900.0, energy_w=10.0 + seed)
    make_run(root, "et", train_type="elastic_training", rho=0.4, epoch_s=400.0, energy_w=9.0)
    make_run(root, "tl", train_type="traditional_tl_training", epoch_s=300.0)  # no sensor
    code, out, err = cli(["energy", str(root), "--out", str(tmp_path / "fig23")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "fig23"))
    assert any("Traditional TL" in line and "no sensor: test" in line for line in err)
    groups = plotting.bar_groups(plotting.load_runs([str(root)]))
    full = next(g for g in groups if g.key.train_type == "full_training")
    np.testing.assert_allclose(plotting.energy_of(full), [36000.0, 39600.0])  # 10-11 W x 3600 s
    only_tl = tmp_path / "tl_only"
    make_run(only_tl, "tl", train_type="traditional_tl_training")
    code, out, err = cli(["energy", str(only_tl), "--out", str(tmp_path / "none")], capsys)
    assert code == 2 and "none of the runs measured energy" in err[-1]


def test_selection_ticks_close_together_are_not_printed_over_each_other():
    # a correction 20 steps (0.13 epoch) after the first re-selection, on a 12-epoch axis
    assert plotting.sparse_tick_labels([0, 0.1333333, 4, 8, 8.05, 12]) == [
        "0", "", "4", "8", "", "12"]
    assert plotting.sparse_tick_labels([0, 0.5, 1, 1.5]) == ["0", "0.5", "1", "1.5"]


def test_time_to_accuracy_figure_from_run_directories(runs, tmp_path, capsys):
    """`plot.py time`'s figure: one line per run, the levels from the full_training run; a
    refused run (its reason in place of a curve) is left out of a drawn figure."""
    from elastictrainer.plotting import time_to_accuracy as ptta

    code, out, err = cli(["time", runs[("full", "caltech_birds2011", 0)],
                          runs[("elastic", "caltech_birds2011", 0)], "--out",
                          str(tmp_path / "tta")], capsys)
    assert code == 0, err
    assert_figures(str(tmp_path / "tta"))
    drawn = ptta.draw({"a": [(1.0, 50.0), (2.0, 60.0)], "b": ptta_refused()},
                      str(tmp_path / "two"))
    assert os.path.exists(drawn[0])


def test_time_to_accuracy_draws_each_run_apart_and_after_its_profiling(tmp_path, monkeypatch):
    """`plot.py time` on runs that differ only in a setting (the prefix cache, rho auto's share)
    draws each one, labelled with its value, instead of one line hiding another; a run that
    profiled before its loop starts its line that much later, one that profiled inside its
    training time (model.fit) does not move."""
    from elastictrainer.plotting import time_to_accuracy as ptta

    def summary_with(d, **fields):
        path = os.path.join(d, runlog.SUMMARY_FILE)
        with open(path) as f:
            data = json.load(f)
        data.update(fields)
        runlog.write_json(path, data)
        return d

    dirs = [make_run(tmp_path, "full", epoch_s=10.0),
            summary_with(make_run(tmp_path, "cached", train_type="elastic_training", rho=0.3,
                                  epoch_s=5.0, cache_frozen_prefix="auto"),
                         profiling_s=4.0, profiling_in_train_time=False),
            summary_with(make_run(tmp_path, "uncached", train_type="elastic_training", rho=0.3,
                                  epoch_s=5.0, cache_frozen_prefix="false"),
                         profiling_s=4.0, profiling_in_train_time=True),
            make_run(tmp_path, "uncached_again", train_type="elastic_training", rho=0.3,
                     epoch_s=5.0, cache_frozen_prefix="false")]
    drawn = []
    monkeypatch.setattr(ptta, "save_figure", lambda fig, out: drawn.append(fig))
    ptta.plot_time_to_accuracy(dirs, str(tmp_path / "tta"))
    lines = {line.get_label(): line.get_xdata()[0]
             for line in drawn[0].axes[0].get_lines() if line.get_marker() == "o"}
    assert len(lines) == 4, lines
    cached = next(k for k in lines if "cache_frozen_prefix=auto" in k)
    uncached = [k for k in lines if "cache_frozen_prefix=false" in k]
    assert sorted(uncached) == sorted(f"ElasticTrainer (ρ=0.3), cache_frozen_prefix=false ({d})"
                                      for d in ("uncached", "uncached_again"))
    # the time axis is in seconds here: the first epoch ends at 5 s of training
    assert lines[cached] == pytest.approx(9.0)
    assert sorted(lines[k] for k in uncached) == [pytest.approx(5.0), pytest.approx(5.0)]
    ptta.pyplot().close(drawn[0])


def test_time_to_accuracy_holds_every_curve_and_draws_levels_of_full_training_only(
        tmp_path, monkeypatch):
    """Runs above full training's best stay on the axis; without a full_training run
    `plot.py time` draws no levels (they are full training's) and still holds every curve."""
    from elastictrainer.plotting import time_to_accuracy as ptta

    drawn = []
    monkeypatch.setattr(ptta, "save_figure", lambda fig, out: drawn.append(fig))
    ptta.draw({"full": [(1.0, 50.0), (2.0, 60.0)], "better": [(1.0, 70.0), (2.0, 75.0)]},
              str(tmp_path / "above"))
    ax = drawn[-1].axes[0]
    assert ax.get_ylim()[1] >= 75.0
    assert len([line for line in ax.get_lines() if line.get_linestyle() == "--"]) == 3
    elastic = [make_run(tmp_path, f"e{k}", train_type="elastic_training", rho=0.5 + k / 10)
               for k in range(2)]
    ptta.plot_time_to_accuracy(elastic, str(tmp_path / "no_full"))
    ax = drawn[-1].axes[0]
    assert not [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    top = max(a for line in ax.get_lines() for a in line.get_ydata())
    assert ax.get_ylim()[1] >= top and "no full_training run" in ax.get_title()
    for fig in drawn:
        ptta.pyplot().close(fig)


def ptta_refused():
    from elastictrainer.experiments.time_to_accuracy import Refused

    return Refused("--rho 0.3 is below this model's forward floor")


def test_a_dozen_schemes_get_a_dozen_colours(tmp_path, monkeypatch):
    """The benchmark's twelve schemes: no two lines share a colour (the default cycle has
    ten)."""
    from elastictrainer.plotting import time_to_accuracy as ptta

    drawn = []
    monkeypatch.setattr(ptta, "save_figure", lambda fig, out: drawn.append(fig))
    ptta.draw({f"scheme {k}": [(1.0, 50.0 + k), (2.0, 60.0 + k)] for k in range(12)},
              str(tmp_path / "dozen"))
    lines = [line for line in drawn[0].axes[0].get_lines() if line.get_marker() == "o"]
    assert len(lines) == 12 and len({line.get_color() for line in lines}) == 12
    ptta.pyplot().close(drawn[0])


def test_a_line_of_runs_repeated_on_one_seed_says_it_averages_runs():
    """Three runs of one seed averaged are three runs, not one seed: their spread is the
    run-to-run noise."""
    from types import SimpleNamespace

    from elastictrainer.plotting import seeds_label

    runs = [SimpleNamespace(seed=s) for s in (0, 0, 0)]
    assert seeds_label(runs) == "3 runs, 1 seed"
    assert seeds_label(runs[:1]) == "1 seed"
    assert seeds_label([SimpleNamespace(seed=s) for s in (0, 1, 2)]) == "3 seeds"
    assert seeds_label([SimpleNamespace(seed=s) for s in (0, 0, 1)]) == "3 runs, 2 seeds"
    from elastictrainer.plotting.bars import _seeds_cell

    assert _seeds_cell(runs) == "1 (3 runs)" and _seeds_cell(runs[:1]) == "1"
