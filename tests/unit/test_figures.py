"""The figure scripts: one driver, the paper's protocol as data, dry runs and the driver's
one-line errors (the smoke figure itself is e2e/test_figures.py's)."""
import glob
import os
import re
import subprocess

import pytest

from elastictrainer import cli, runlog
from elastictrainer.errors import UserError
from elastictrainer.experiments import figures
from elastictrainer.method.schemes import BASELINES

from helpers import ROOT, TRAIN_COMMAND as TRAIN, script_cli

SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "scripts", "run_figure*.sh")))


def test_every_paper_figure_has_a_script_and_an_ego_variant():
    names = {os.path.basename(s) for s in SCRIPTS}
    for key in ("15", "16", "17", "19"):
        assert {f"run_figure{key}.sh", f"run_figure{key}_ego.sh"} <= names
    assert set(figures.FIGURES) == {"fig15", "fig16", "fig17", "fig19"}


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_script_header_and_one_shared_driver(script):
    text = open(script).read()
    assert os.access(script, os.X_OK)
    header = "".join(line for line in text.splitlines(True) if line.startswith("#"))
    assert "Time" in header and re.search(r"\d+(\.\d+)? h\b", header), "device time missing"
    assert "Figure" in header
    # no copy-pasted blocks: every script is its header and one call of the shared driver
    code = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    key = re.search(r"run_figure(\d+)", script).group(1)
    ego = " --ego" if script.endswith("_ego.sh") else ""
    assert code == [f'exec "$(dirname "$0")/figure.sh" fig{key}{ego} "$@"']


def test_protocol_runs_are_the_papers_with_honest_rho():
    runs = figures.plan(figures.FIGURES["fig17"])
    elastic = [r for r in runs if r.train_type == "elastic_training"]
    assert [r.rho for r in elastic] == [0.35, 0.4, 0.5, 0.6, 0.7]
    assert {r.train_type for r in runs} - {"elastic_training"} == set(BASELINES)
    assert {r.train_type for r in figures.plan(figures.FIGURES["fig17"], ego=True)} == {"elastic_training"}
    fig15 = figures.plan(figures.FIGURES["fig15"])
    assert {r.dataset for r in fig15} == set(figures.PAPER_DATASETS) and len(fig15) == 12
    assert [r.num_classes for r in fig15[::4]] == [200, 37, 120]
    fig19 = figures.plan(figures.FIGURES["fig19"])
    assert {r.model for r in fig19} == {"resnet50", "vgg16", "mobilenetv2", "vit"}
    smoke = figures.plan(figures.FIGURES["fig19"], smoke=True)
    assert {r.dataset for r in smoke} == {"synthetic"} and {r.model for r in smoke} == {"smallcnn", "mobilenetv2"}
    # above the smoke model's forward floor (0.31-0.40 on the machines measured), so every smoke
    # figure has ElasticTrainer
    for key in figures.FIGURES:
        smoke = figures.plan(figures.FIGURES[key], smoke=True)
        assert min(r.rho for r in smoke if r.rho is not None) >= 0.5
    # the smoke protocol is the smallcnn setting: fine-tuning a synthetic-pretrained model
    flags = figures.SMOKE.flags("smallcnn")
    assert flags["weights"] == "synthetic" and flags["num_test"] >= 1000
    assert figures.PAPER.flags("vit")["optimizer"] == "adam"
    assert figures.PAPER.flags("resnet50")["optimizer"] == "sgd"


def test_dry_run_prints_the_reference_command_lines(tmp_path):
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "run_figure17.sh"), "--dry_run",
                          "--logdir", str(tmp_path / "logs"), "--profiles", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    mains = [line for line in lines if TRAIN in line]
    assert len(mains) == 9
    assert sum("--rho 0.35 " in line for line in mains) == 1 and "0.367" not in out.stdout
    assert all("--input_size 224 --batch_size 4 --num_epochs 12 --interval 4" in line for line in mains)
    assert any(" -m elastictrainer profile --model_name resnet50 --optimizer sgd " in line
               for line in lines)
    assert not os.path.exists(tmp_path / "logs")  # nothing ran, and it says so
    assert "fig17: 9 runs to run (dry run: nothing ran)" in lines
    assert all(line.startswith("  would write ") for line in lines[lines.index(
        "fig17: 9 runs to run (dry run: nothing ran)") + 1:])
    # each command pastes as it is: an empty argument stays one ('')
    import shlex

    profile = next(line for line in lines if " -m elastictrainer profile " in line)
    argv = shlex.split(profile[2:])
    assert argv[argv.index("--figure") + 1] == ""
    # the paper's protocol: every step runs the whole forward pass, unless asked otherwise
    assert all("--cache_frozen_prefix false" in line for line in mains)


def test_the_figures_runs_cache_only_when_asked(tmp_path, monkeypatch, capsys):
    """The paper's protocol leaves the prefix cache off (train's default is auto); the figure
    command passes --cache_frozen_prefix on to every run when asked, and a bad value is one
    line, exit 2."""
    from elastictrainer import cli

    def trains(*flags):
        lines = []
        driver = figures.Driver("fig17", ego=True, smoke=True, dry_run=True,
                                logdir=str(tmp_path / "logs"), profiles=str(tmp_path / "p"),
                                log=lines.append, **dict(flags))
        return [driver.train_args(run, 0, driver.logdir, driver.profiles) for run in driver.runs]

    for value, passed in ((False, "false"), ("auto", "auto"), (True, "true")):
        runs = trains(("cache_frozen_prefix", value))
        assert runs and all(args[args.index("--cache_frozen_prefix") + 1] == passed
                            for args in runs)
    assert all("--cache_frozen_prefix false" in " ".join(args) for args in trains())
    parsed = cli.figure_parser().parse_args(["fig17", "--cache_frozen_prefix", "auto"])
    assert parsed.cache_frozen_prefix == "auto"
    assert cli.figure_parser().parse_args(["fig17"]).cache_frozen_prefix is False
    assert_one_line_exit_2(["figure", "fig17", "--cache_frozen_prefix", "sometimes",
                            "--dry_run"], "--cache_frozen_prefix", capsys)
    # cached runs are not the paper's: their folder and figures are named apart
    monkeypatch.chdir(tmp_path)
    paper = figures.Driver("fig17", smoke=True, dry_run=True, log=lambda m: None)
    cached = figures.Driver("fig17", smoke=True, dry_run=True, log=lambda m: None,
                            cache_frozen_prefix="auto")
    assert paper.logdir.endswith("fig17") and cached.logdir.endswith("fig17_cacheauto")
    assert paper.suffix == "" and cached.suffix == "_cacheauto"
    # a finished run of the other setting in the folder given is refused, not taken as done
    run = cached.runs[0]
    done = cached.run_dir(run, 0)
    os.makedirs(done)
    runlog.write_json(os.path.join(done, runlog.SUMMARY_FILE), {"status": "finished"})
    runlog.write_json(os.path.join(done, runlog.CONFIG_FILE), {"cache_frozen_prefix": False})
    with pytest.raises(UserError, match="finished with --cache_frozen_prefix false, not auto"):
        cached.sort_runs([])
    runlog.write_json(os.path.join(done, runlog.CONFIG_FILE), {"cache_frozen_prefix": "auto"})
    done_runs, _ = cached.sort_runs([])
    assert (run, 0) in done_runs


def test_bad_figure_name_is_one_line_exit_2(capsys):
    assert_one_line_exit_2(["figure", "fig99"], "fig15", capsys)


def _fake_table(folder, t_fp=4.5, t_full=10.0):
    """The smoke protocol's table (Adam, so the _adam name)."""
    import json
    table = {"model": "smallcnn", "input_size": 64, "batch_size": 32, "num_classes": 10,
             "optimizer": "adam", "t_fp_ms": t_fp, "t_bp_ms": t_full - t_fp, "t_full_ms": t_full,
             "coverage": 1.0, "unattributed": [], "tensors": []}
    (folder / "smallcnn_i64_b32_c10_adam.json").write_text(json.dumps(table))


def test_rho_below_the_forward_floor_is_skipped_with_a_reason(tmp_path):
    _fake_table(tmp_path, t_fp=6.5)
    lines = []
    driver = figures.Driver("fig17", ego=True, smoke=True, profiles=str(tmp_path),
                            logdir=str(tmp_path / "logs"), dry_run=True, log=lines.append)
    _, failed = driver()
    assert not failed
    skipped = [line for line in lines if "forward floor 0.65" in line]
    assert len(skipped) == 4  # rho 0.5 and 0.6, as it happens and in the final report
    assert sum(TRAIN in line and "--rho" in line for line in lines) == 2  # 0.7 and 0.8


def test_ctrl_c_in_a_run_stops_the_driver_and_says_how_to_go_on(tmp_path):
    _fake_table(tmp_path, t_fp=2.0)
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\nexit 130\n")  # what training returns after Ctrl-C
    fake.chmod(0o755)
    lines = []
    driver = figures.Driver("fig15", smoke=True, python=str(fake), log=lines.append,
                            logdir=str(tmp_path / "logs"), profiles=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        driver()
    assert sum(TRAIN in line for line in lines) == 1  # stopped at the first run
    assert "run the same command again" in lines[-1]


def test_comma_lists_parse_or_fail_as_usage_errors():
    import argparse

    from elastictrainer import config as common_flags
    assert common_flags.comma_list(float)("0.4, 0.5,") == (0.4, 0.5)
    assert cli.figure_parser().parse_args(["fig17"]).seeds == (0,)
    assert cli.figure_parser().parse_args(["fig17", "--seeds", "0,1,2"]).seeds == (0, 1, 2)
    for bad in ("x", "", " , "):
        with pytest.raises(argparse.ArgumentTypeError):
            common_flags.comma_list(int, "integers")(bad)


def assert_one_line_exit_2(argv, needle, capsys):
    """The command, run as its console script runs it: one line on stderr, exit code 2."""
    capsys.readouterr()  # only this command's output
    code, _, lines = script_cli("elastictrainer.cli", argv, capsys)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_a_quick_check_caps_steps_and_test_images_and_bad_caps_stop_before_anything_runs(
        tmp_path, capsys):
    """--steps_per_epoch and --num_test reach every training run, --num_test over the
    protocol's own; a bad value of either is one line, exit 2, before anything runs."""
    driver = figures.Driver("fig15", smoke=True, dry_run=True, log=lambda m: None,
                            logdir=str(tmp_path / "logs"), profiles=str(tmp_path / "p"),
                            steps_per_epoch=6, num_test=64)
    for run in driver.runs:
        args = driver.train_args(run, 0, driver.logdir, driver.profiles)
        assert args.count("--num_test") == 1 and args[args.index("--num_test") + 1] == "64"
        assert args[args.index("--steps_per_epoch") + 1] == "6"
    for flag in ("--steps_per_epoch", "--num_test"):
        assert_one_line_exit_2(["figure", "fig15", "--smoke", flag, "0", "--logdir",
                                str(tmp_path / "logs")], flag, capsys)
    assert not os.path.exists(tmp_path / "logs")


def test_offline_runs_the_paper_regime_with_the_papers_rhos(tmp_path, capsys):
    """OFFLINE=1 (--offline): Fig. 17's runs are the time-to-accuracy benchmark's
    efficientnet_textures configuration (ImageNet EfficientNet-Lite0 on synthetic_textures), at
    the paper's rhos, under logs/offline and figures/offline; a rho at or below the forward floor
    is skipped with the reason.  Fig. 19 adds the backbones `--weights synthetic` pretrains,
    each on its own regime."""
    import json

    run = figures.plan(figures.FIGURES["fig17"], offline=True)[0]
    assert (run.model, run.dataset, run.num_classes) == (
        "efficientnet_lite0", "synthetic_textures", 40)
    path = figures.table_path(run, figures.offline_regime(run.model)[0], str(tmp_path / "p"))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:  # a forward floor of 0.38: rho 0.35 cannot be run
        json.dump({"model": "efficientnet_lite0", "input_size": 96, "batch_size": 8,
                   "num_classes": 40, "optimizer": "sgd", "t_fp_ms": 3.8, "t_bp_ms": 6.2,
                   "t_full_ms": 10.0, "coverage": 1.0, "unattributed": [], "tensors": []}, f)
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "run_figure17.sh"), "--dry_run",
                          "--profiles", str(tmp_path / "p")], cwd=tmp_path,
                         env={**os.environ, "OFFLINE": "1"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    mains = [line for line in lines if TRAIN in line]
    assert len(mains) == 8  # rho 0.4-0.7 and the four baselines
    assert all("--model_name efficientnet_lite0 --dataset_name synthetic_textures "
               "--train_type " in line and "--num_classes 40 " in line for line in mains)
    assert all(line.endswith("--input_size 96 --batch_size 8 --num_epochs 8 --interval 4 "
                             "--learning_rate 0.01 --optimizer sgd --weights imagenet "
                             "--head_warmup 0 --num_train 1500 --num_test 4096 "
                             "--bn_mode frozen")
               for line in mains)
    assert all("--cache_frozen_prefix false" in line for line in mains)
    assert [line.split("--rho ")[1].split()[0] for line in mains if "--rho" in line] == [
        "0.4", "0.5", "0.6", "0.7"]
    assert {line.split("--train_type ")[1].split()[0] for line in mains} == {
        "elastic_training", *BASELINES}
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1 and "rho0.35" in skipped[0] and "forward floor 0.38" in skipped[0]
    assert all(f" --logdir {tmp_path}/logs/offline/fig17 " in line for line in mains)
    assert any(f"--out {tmp_path}/figures/offline/fig17 " in line + " " for line in lines)
    assert any("figures/offline/fig17.md and .json" in line for line in lines)
    assert not os.path.exists(tmp_path / "logs")  # nothing ran
    # Fig. 19 offline: the ImageNet backbone on its target, the backbones --weights synthetic
    # pretrains on the synthetic data, at the paper's rho
    fig19 = figures.plan(figures.FIGURES["fig19"], offline=True)
    assert {(r.model, r.dataset) for r in fig19} == {
        ("efficientnet_lite0", "synthetic_textures"), ("mobilenetv2", "synthetic"),
        ("smallcnn", "synthetic")}
    assert {r.rho for r in fig19} == {None, 0.4}
    driver = figures.Driver("fig19", offline=True, dry_run=True, profiles=str(tmp_path / "p"))
    lr = {r.model: driver.train_args(r, 0, "l", "p") for r in fig19}
    assert lr["mobilenetv2"][lr["mobilenetv2"].index("--weights") + 1] == "synthetic"
    assert lr["mobilenetv2"][lr["mobilenetv2"].index("--learning_rate") + 1] == "0.001"
    assert lr["efficientnet_lite0"][lr["efficientnet_lite0"].index("--learning_rate") + 1] == (
        "0.01")
    # one protocol at a time: one line, exit 2
    assert_one_line_exit_2(["figure", "fig17", "--offline", "--smoke", "--dry_run"],
                           "two protocols", capsys)
