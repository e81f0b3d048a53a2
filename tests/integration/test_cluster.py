"""A figure's runs as Ray tasks (cluster.py) on a Ray cluster of two nodes started here, one of
them advertising the custom resource pi4.  The runs are a stand-in for `elastictrainer`: a
script that records each attempt and writes what profile and train would (the smoke figure
through the real commands is e2e/test_figures.py's), so that these tests check the scheduling,
the files that come back, the retries and the resume rule in seconds."""
import json
import os
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray", reason="the cluster extra: pip install -e '.[cluster]'")
from ray.cluster_utils import Cluster  # noqa: E402

from elastictrainer.experiments import cluster  # noqa: E402
from elastictrainer.experiments import figures
from elastictrainer.errors import UserError  # noqa: E402

RUNS = ["smallcnn_synthetic_elastic_training_rho0.5_seed0",
        "smallcnn_synthetic_full_training_seed0",
        "smallcnn_synthetic_traditional_tl_training_seed0",
        "smallcnn_synthetic_bn_plus_bias_training_seed0"]

FAKE = r'''#!{python}
"""Stands in for `python -m elastictrainer ...`: records each attempt in {attempts}; a train
run writes what a run directory needs (a checkpoint appended to per attempt, summary.json)."""
import json, os, signal, sys

args = sys.argv[3:]
flag = lambda name: args[args.index(name) + 1]
os.makedirs({attempts!r}, exist_ok=True)

def attempt(name):
    with open(os.path.join({attempts!r}, name), "a") as f:
        f.write(os.getcwd() + "\n")
    with open(os.path.join({attempts!r}, name)) as f:
        return len(f.readlines())

if args[0] == "profile":
    attempt("profile_" + os.path.basename(flag("--output")))
    os.makedirs(os.path.dirname(flag("--output")), exist_ok=True)
    table = {{"model": "smallcnn", "input_size": 64, "batch_size": 32, "num_classes": 10,
             "optimizer": "adam", "t_fp_ms": 2.0, "t_bp_ms": 8.0, "t_full_ms": 10.0,
             "coverage": 1.0, "unattributed": [], "tensors": []}}
    with open(flag("--output"), "w") as f:
        json.dump(table, f)
elif args[0] == "train":
    name = flag("--run_name")
    n = attempt(name)
    run_dir = os.path.join(flag("--logdir"), name)
    os.makedirs(run_dir, exist_ok=True)
    resumed = os.path.exists(os.path.join(run_dir, "checkpoint"))
    with open(os.path.join(run_dir, "checkpoint"), "a") as f:
        f.write(f"attempt {{n}}\n")
    if name == {kill!r} and n == 1:
        os.kill(os.getppid(), signal.SIGKILL)  # the Ray worker running this run dies
        sys.exit(1)
    if name == {interrupt_driver!r} and n == 1:
        signal.alarm(10)  # a safety net: the driver's cancel interrupts this long before
        with open({driver_pid!r}) as f:
            os.kill(int(f.read()), signal.SIGINT)  # Ctrl-C on the driver
        try:
            signal.pause()
        except KeyboardInterrupt:  # passed on by the cancelled task: save and stop
            with open(os.path.join(run_dir, "checkpoint"), "a") as f:
                f.write("saved at Ctrl-C\n")
            sys.exit(130)
    if name == {fail!r}:
        print("loss is NaN at step 3")
        sys.exit(1)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({{"status": "finished", "resumed": resumed, "cwd": os.getcwd()}}, f)
    if name == {kill_driver!r} and n == 1:
        with open({driver_pid!r}) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # the sweep stops as this run ends
    print(name, "finished")
'''


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A head node and a 'pi4' node, one CPU each; their workers keep unfinished runs under
    this module's own cache folder."""
    cache = tmp_path_factory.mktemp("node_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        pi4 = c.add_node(num_cpus=1, resources={"pi4": 1})
        c.wait_for_nodes()
        yield c, pi4.node_id, cache
        c.shutdown()


def fake_python(tmp_path, kill="", fail="", kill_driver="", interrupt_driver=""):
    path = tmp_path / "fake_python"
    path.write_text(FAKE.format(python=sys.executable, attempts=str(tmp_path / "attempts"),
                                kill=kill, fail=fail, kill_driver=kill_driver,
                                interrupt_driver=interrupt_driver,
                                driver_pid=str(tmp_path / "driver.pid")))
    path.chmod(0o755)
    return str(path)


def attempts(tmp_path):
    folder = tmp_path / "attempts"
    return {name: len((folder / name).read_text().splitlines()) for name in os.listdir(folder)}


def sweep(tmp_path, address, python, resources=None, lines=None):
    runner = cluster.RayRunner(address, resources, progress=False)
    driver = figures.Driver("15", smoke=True, logdir=str(tmp_path / "logs"),
                            figdir=str(tmp_path / "figs"), profiles=str(tmp_path / "profiles"),
                            python=python, log=(lines if lines is not None else []).append,
                            runner=runner)
    _, failed = driver()
    return runner, failed


def summaries(tmp_path):
    logs = tmp_path / "logs"
    return {name: json.loads((logs / name / "summary.json").read_text())
            for name in os.listdir(logs)}


def test_pinned_runs_go_only_to_the_nodes_that_advertise_the_resource_and_come_back(
        tmp_path, two_nodes):
    c, pi4_node, cache = two_nodes
    runner, failed = sweep(tmp_path, c.address, fake_python(tmp_path), {"pi4": 1})
    assert not failed
    assert set(runner.placements) == set(RUNS) | {"profile smallcnn"}
    assert set(runner.placements.values()) == {pi4_node}
    # profiled once, for the kind of device the runs are pinned to
    assert attempts(tmp_path) == dict({r: 1 for r in RUNS},
                                      **{"profile_smallcnn_i64_b32_c10_adam.json": 1})
    assert (tmp_path / "profiles" / "pi4" / "smallcnn_i64_b32_c10_adam.json").exists()
    # each run ran in a folder of its node, and its directory came back here whole
    runs = summaries(tmp_path)
    assert sorted(runs) == sorted(RUNS)
    assert all(s["status"] == "finished" and s["cwd"].startswith(str(cache)) for s in runs.values())
    assert sorted(os.listdir(tmp_path / "logs")) == sorted(RUNS)  # no half-written copies
    kept = set(os.listdir(cache / "elastictrainer" / "cluster"))
    assert not kept & {cluster.keep_name(str(tmp_path / "logs" / r)) for r in RUNS}  # finished

    # started again: every run is found finished, none is run again
    again, failed = sweep(tmp_path, c.address, fake_python(tmp_path), {"pi4": 1})
    assert not failed and again.placements == {}
    assert set(attempts(tmp_path).values()) == {1}


def test_a_run_whose_worker_is_killed_is_rerun_from_its_checkpoint_and_not_duplicated(
        tmp_path, two_nodes):
    c, pi4_node, _ = two_nodes
    killed = RUNS[1]
    runner, failed = sweep(tmp_path, c.address, fake_python(tmp_path, kill=killed), {"pi4": 1})
    assert not failed
    counts = attempts(tmp_path)
    assert counts.pop(killed) == 2 and set(counts.values()) == {1}
    runs = summaries(tmp_path)
    assert sorted(runs) == sorted(RUNS) and all(s["status"] == "finished" for s in runs.values())
    # Ray's retry ran it on the same board, which had kept its working folder: it continued
    assert runs[killed]["resumed"] is True
    assert (tmp_path / "logs" / killed / "checkpoint").read_text() == "attempt 1\nattempt 2\n"


def test_an_unfinished_run_here_continues_on_the_cluster_from_this_copy(tmp_path, two_nodes):
    c, _, _ = two_nodes
    partial = tmp_path / "logs" / RUNS[0]  # as the serial driver leaves a run it was in
    partial.mkdir(parents=True)
    (partial / "checkpoint").write_text("serial\n")
    _, failed = sweep(tmp_path, c.address, fake_python(tmp_path))
    assert not failed
    assert summaries(tmp_path)[RUNS[0]]["resumed"] is True
    assert (partial / "checkpoint").read_text() == "serial\nattempt 1\n"


def test_a_run_that_fails_twice_is_reported_by_name_and_the_others_go_on(tmp_path, two_nodes):
    c, _, _ = two_nodes
    bad = RUNS[3]
    lines = []
    _, failed = sweep(tmp_path, c.address, fake_python(tmp_path, fail=bad), lines=lines)
    assert len(failed) == 1 and failed[0].startswith(f"{bad}: failed twice (exit 1 ")
    assert "loss is NaN at step 3" in failed[0]
    assert attempts(tmp_path)[bad] == 2
    assert sorted(summaries(tmp_path)) == sorted(RUNS[:3])
    assert any(line.startswith(f"  FAILED {bad}: failed twice") for line in lines)
    assert any("plot bars" in line for line in lines)  # the figure is drawn from the others


def sweep_in_a_process(tmp_path, address, python):
    """A pinned sweep by a driver process of its own, which writes its pid first (for the
    stand-in runs that stop it)."""
    # Ctrl-C as a terminal delivers it: the test runner may run as a shell's background job,
    # which ignores SIGINT, and its children inherit that
    code = ("import signal\nsignal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"import os\nopen({str(tmp_path / 'driver.pid')!r}, 'w').write(str(os.getpid()))\n"
            "from elastictrainer import errors\nfrom elastictrainer.experiments import cluster, figures\n"
            f"runner = cluster.RayRunner({address!r}, {{'pi4': 1}}, progress=False)\n"
            f"driver = figures.Driver('15', smoke=True, logdir={str(tmp_path / 'logs')!r}, "
            f"figdir={str(tmp_path / 'figs')!r}, profiles={str(tmp_path / 'profiles')!r}, "
            f"python={python!r}, runner=runner)\n"
            "errors.run_cli(lambda argv: driver()[1] and 1)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_ctrl_c_stops_the_sweep_and_the_next_one_continues_its_runs(tmp_path, two_nodes):
    c, _, _ = two_nodes
    victim = RUNS[1]
    python = fake_python(tmp_path, interrupt_driver=victim)
    out = sweep_in_a_process(tmp_path, c.address, python)
    assert out.returncode == 130, out.stderr[-2000:]
    assert "interrupted: finished runs are kept; run the same command again" in out.stdout
    assert victim not in os.listdir(tmp_path / "logs")

    runner, failed = sweep(tmp_path, c.address, python, {"pi4": 1})
    assert not failed
    counts = attempts(tmp_path)
    assert counts.pop(victim) == 2 and set(counts.values()) == {1}
    runs = summaries(tmp_path)
    assert sorted(runs) == sorted(RUNS) and runs[victim]["resumed"] is True
    # it went on from its own checkpoint.  Whether it saved once more at the Ctrl-C depends on
    # the cancel reaching it before Ray shuts down, which the driver does not wait for
    saved = (tmp_path / "logs" / victim / "checkpoint").read_text()
    assert saved in ("attempt 1\nsaved at Ctrl-C\nattempt 2\n", "attempt 1\nattempt 2\n")


def test_a_sweep_killed_mid_way_resumes_without_running_any_run_twice(tmp_path, two_nodes):
    c, _, _ = two_nodes
    victim = RUNS[2]  # it finishes on its board just as its driver is killed
    python = fake_python(tmp_path, kill_driver=victim)
    out = sweep_in_a_process(tmp_path, c.address, python)
    assert out.returncode == -9, out.stderr[-2000:]
    finished_before = {name for name in os.listdir(tmp_path / "logs") if name in RUNS}
    assert finished_before and victim not in finished_before

    runner, failed = sweep(tmp_path, c.address, python, {"pi4": 1})
    assert not failed
    # every run ran once: the finished ones were not submitted again, and the victim's board
    # sent the run it had finished instead of running it again
    assert attempts(tmp_path) == dict({r: 1 for r in RUNS},
                                      **{"profile_smallcnn_i64_b32_c10_adam.json": 1})
    assert not set(runner.placements) & finished_before and victim in runner.placements
    runs = summaries(tmp_path)
    assert sorted(runs) == sorted(RUNS) and all(s["status"] == "finished" for s in runs.values())
    assert (tmp_path / "logs" / victim / "checkpoint").read_text() == "attempt 1\n"


def test_a_resource_no_node_advertises_is_one_line_naming_the_nodes(tmp_path, two_nodes):
    c, _, _ = two_nodes
    with pytest.raises(UserError) as e:
        sweep(tmp_path, c.address, fake_python(tmp_path), {"jetson_orin": 1})
    text = str(e.value)
    assert "--ray_resources jetson_orin=1: no node advertises it" in text
    assert "pi4 1" in text and text.count("CPU 1") == 2 and "\n" not in text
    assert not (tmp_path / "attempts").exists() and not (tmp_path / "logs").exists()
    assert not ray.is_initialized()


def test_an_unreachable_address_is_one_line_at_once(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError) as e:
        sweep(tmp_path, f"127.0.0.1:{port}", fake_python(tmp_path))
    assert f"--ray 127.0.0.1:{port}: cannot reach a Ray cluster there" in str(e.value)
    assert not (tmp_path / "logs").exists()
