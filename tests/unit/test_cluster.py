"""`elastictrainer figure --ray`'s flags, errors and file handling, without a Ray cluster (the
runs on one are integration/test_cluster.py's), and the test command that installs Ray for them."""
import argparse
import os
import re
import sys

import pytest

from elastictrainer import cli, config, errors
from elastictrainer.experiments import cluster
from elastictrainer.experiments import cluster_node

from helpers import ROOT


def run_cli(argv, capsys):
    """`elastictrainer ARGV` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        errors.run_cli(cli.main, argv)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_resources_parse_or_fail_as_usage_errors():
    assert config.parse_resources("pi4=1") == {"pi4": 1.0}
    assert config.parse_resources("pi4=1, big_memory=0.5,") == {"pi4": 1.0, "big_memory": 0.5}
    for bad in ("pi4=x", "=1", "pi4=0", "pi4=-1", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            config.parse_resources(bad)


def test_ray_missing_is_one_line_saying_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    code, _, err = run_cli(["figure", "17", "--smoke", "--ray", "local",
                            "--logdir", str(tmp_path / "logs"),
                            "--profiles", str(tmp_path / "profiles")], capsys)
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--ray needs Ray" in lines[0]
    assert "pip install 'elastictrainer[cluster]'" in lines[0]
    assert not (tmp_path / "logs").exists() and not (tmp_path / "profiles").exists()


def test_resources_without_a_cluster_are_a_usage_error(capsys):
    code, _, err = run_cli(["figure", "17", "--ray_resources", "pi4=1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "needs --ray" in err
    code, _, err = run_cli(["figure", "17", "--ray", "local", "--ray_resources", "pi4="], capsys)
    assert code == 2 and err.count("\n") == 1 and "NAME=N" in err


def test_dry_run_on_a_cluster_contacts_none_and_uses_the_device_kinds_tables(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # it would fail if Ray were needed
    code, out, _ = run_cli(["figure", "17", "--smoke", "--dry_run", "--ray", "127.0.0.1:1",
                            "--ray_resources", "pi4=1", "--logdir", str(tmp_path / "logs"),
                            "--profiles", str(tmp_path / "profiles")], capsys)
    assert code == 0
    table = os.path.join(str(tmp_path), "profiles", "pi4", "smallcnn_i64_b32_c10_adam.json")
    assert f"--output {table} " in out
    trains = [line for line in out.splitlines() if " -m elastictrainer train " in line]
    assert len(trains) == 8 and all(f"--timing_table {table} " in line for line in trains)


def test_figures_are_named_by_key_or_number():
    parser = cli.figure_parser()
    assert parser.parse_args(["17"]).figure == "fig17"
    assert parser.parse_args(["Fig19"]).figure == "fig19"
    with pytest.raises(errors.UserError, match="valid: fig15, fig16, fig17, fig19"):
        parser.parse_args(["18"])


def test_a_run_directory_that_comes_back_replaces_the_old_copy_whole(tmp_path):
    dest = tmp_path / "logs" / "run"
    dest.mkdir(parents=True)
    (dest / "stale_checkpoint").write_text("old")
    files = {os.path.join("logs", "run", "summary.json"): b'{"status": "finished"}',
             os.path.join("logs", "run", "checkpoints", "ckpt-1.index"): b"\x00\x01"}
    cluster.install_run_dir(files, os.path.join("logs", "run"), str(dest))
    assert sorted(os.listdir(tmp_path / "logs")) == ["run"]  # no staging folder left
    assert sorted(os.listdir(dest)) == ["checkpoints", "summary.json"]
    assert (dest / "checkpoints" / "ckpt-1.index").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="outside"):
        cluster_node.write_files({os.path.join("..", "escape"): b""}, str(tmp_path / "x"))


def test_the_test_command_installs_ray_so_that_ci_runs_the_cluster_tests():
    """The newest TensorFlow's venv installs the cluster extra; the oldest's runs only the tests
    marked tf_versions, and none of their modules uses Ray, so it goes without."""
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    command = next(line.strip() for line in ci.splitlines() if line.startswith("python3 -m venv"))
    installs = re.findall(r"pip install -q -r (\S+) -e (\S+)", command)
    assert installs == [("requirements.txt", "'.[cluster]'"), ("requirements-tf216.txt", ".")]
    for base, _, names in os.walk(os.path.join(ROOT, "tests")):
        for name in names:
            path = os.path.join(base, name)
            text = open(path).read() if name.endswith(".py") and path != __file__ else ""
            marked = "mark.tf_versions" in text
            assert not (marked and re.search(r"import ray|importorskip\(.ray.", text)), name
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'^cluster = \["ray>=[\d.]+,<\d+"\]', pyproject, re.M)
