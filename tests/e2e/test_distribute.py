"""--strategy end to end, in subprocesses (the CPU is split into logical devices, and a
multi-worker strategy configured, only as a process starts): mirrored on 2 logical CPUs and two
workers on localhost train as one device does on the same global batches (the two workers
after one was lost, which failed the run, and the run resumed), every replica and worker ends
with the same weights and ran the same steps, the all-reduced bytes are the selected tensors'
exactly, and a batch that does not divide among the replicas is one line.  The settings refused
before a strategy is made are tests/unit/test_distribute.py's; --weights synthetic made before
the strategy's scope is tests/integration/test_pretrain.py's."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from elastictrainer import runlog
from elastictrainer.profiler import run as prun
from elastictrainer.train.distribution import local_cluster
from elastictrainer.runs.interrupt import FAULT_AT_STEP_ENV
from helpers import ROOT

EPOCHS, STEPS = 2, 8
# one device and two replicas sum the same losses in another order: Adam carries the rounding
# on, so the runs agree to this relative tolerance (and on test accuracy within two images)
LOSS_RTOL = 1e-3


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A model without BatchNorm (replicas normalise over their own share of a batch, so a
    BatchNorm model trains differently on two replicas than on one device) and its table."""
    import tf_keras as keras
    tmp = tmp_path_factory.mktemp("dist")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    for filters in (8, 16, 16):
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs, name="nobn")
    model.save(str(tmp / "nobn.keras"))
    # profiled in this process (profiler.py's command line is test_profiler.py's).  The runs
    # compare one device with two and need rho 0.7 to leave a partial selection: the forward
    # share of this tiny model's step, timed on a loaded 2-core machine, came out anywhere from
    # 0.6 to 0.8, so it is pinned at half the step the profiler measured; and without a
    # calibration's fitted scales the tensors' times add up to the other half, so that training
    # all of them is priced at the full step, above 0.7.
    table = prun.profile_model(model, str(tmp / "nobn.keras"), 16, 8, 10, num_iterations=2,
                               progress=False, calibrate=False, optimizer="adam")
    table["t_fp_ms"] = table["t_bp_ms"] = table["t_full_ms"] / 2
    runlog.write_json(str(tmp / "table.json"), table)
    _one_device(tmp, "one_elastic", "elastic_training")
    return tmp


def _one_device(tmp, name, train_type):
    """The one-device run a strategy's is matched against, in this process: only the
    strategies need a fresh one (main.py's command line on one device is test_train.py's)."""
    import main as main_cli

    assert main_cli.main(_cmd(tmp, name, train_type)[2:]) == 0


def _cmd(tmp, name, train_type, *extra):
    return [sys.executable, os.path.join(ROOT, "main.py"), "--model_name", str(tmp / "nobn.keras"),
            "--input_size", "16", "--dataset_name", "synthetic", "--num_train", "64",
            "--num_test", "64", "--batch_size", "8", "--optimizer", "adam",
            "--learning_rate", "0.003", "--num_epochs", str(EPOCHS), "--steps_per_epoch",
            str(STEPS), "--interval", "1", "--rho", "0.7", "--rho_feedback", "false",
            "--economy", "false", "--train_type", train_type, "--timing_table",
            str(tmp / "table.json"), "--logdir", str(tmp / "logs"), "--run_name", name,
            # a strategy's runs are uncached: the one-device runs they match are too
            "--cache_frozen_prefix", "false", "--quiet"] + list(extra)


def _summary(tmp, name):
    return runlog.read_summary(str(tmp / "logs" / name))


def _assert_same_training(a, b):
    assert [e["epoch"] for e in a["epochs"]] == [e["epoch"] for e in b["epochs"]]
    np.testing.assert_allclose([e["train_loss"] for e in a["epochs"]],
                               [e["train_loss"] for e in b["epochs"]], rtol=LOSS_RTOL)
    np.testing.assert_allclose([e["test_accuracy"] for e in a["epochs"]],
                               [e["test_accuracy"] for e in b["epochs"]], atol=100 * 2 / 64)


def _expected_bytes(summary, table):
    """The all-reduced bytes per step that `ran` implies: a probe or timed full step moves
    every gradient, a selection's step its tensors' (float32)."""
    sizes = [4 * int(np.prod(t["shape"])) for t in table["tensors"]]
    total = EPOCHS * STEPS
    marks = summary["ran"] + [[total, None, None]]
    moved = 0
    for (step, kind, tensors), (end, _, _) in zip(marks, marks[1:]):
        per_step = sum(sizes) if kind in ("probe", "full") else sum(sizes[k] for k in tensors)
        moved += (end - step) * per_step
    return moved / total, sum(sizes)


def test_mirrored_on_two_logical_cpus_trains_as_one_device(work):
    """An elastic run on two replicas: its probes and timed full steps all-reduce every
    gradient, as full training's steps do, and its selections' steps only theirs."""
    tmp = work
    r = subprocess.run(_cmd(tmp, "mirrored", "elastic_training", "--strategy", "mirrored",
                            "--logical_cpus", "2"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    one = _summary(tmp, "one_elastic")
    two = _summary(tmp, "mirrored")
    assert two["strategy"] == "mirrored" and two["replicas"] == 2
    _assert_same_training(one, two)
    assert two["replicas_agree"] and len(set(two["replica_checksums"])) == 1
    table = json.load(open(tmp / "table.json"))
    expected, full = _expected_bytes(two, table)
    assert {kind for _, kind, _ in two["ran"]} >= {"probe", "selection"}
    assert two["full_allreduce_bytes_per_step"] == full
    assert two["allreduce_bytes_per_step"] == pytest.approx(expected, rel=1e-12)
    assert [s["mask"] for s in one["selections"]] == [s["mask"] for s in two["selections"]]
    assert two["allreduce_bytes_per_step"] < full  # frozen tensors are not all-reduced


def test_the_bytes_all_reduced_are_read_from_the_steps_graphs_and_match_their_count():
    """On a mirrored strategy over two logical CPUs, every step of CompiledSteps all-reduces,
    per replica and by its graph's collective ops, exactly its selection's gradient bytes, which
    is what it counts; a step that all-reduced every gradient for a selection of two shows it."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "e2e", "collectives_run.py")],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    sizes, replicas = out["sizes"], out["replicas"]
    assert replicas == 2
    kinds = set()
    for step in out["steps"]:
        expected = sum(sizes[k] for k in step["selection"])
        assert step["measured"] == expected == step["counted"], step
        # one all-reduce per replica, each on its own device
        assert len({op[0] for op in step["ops"]}) == replicas, step["ops"]
        kinds.add(len(step["selection"]))
    assert len(kinds) == 4  # every tensor, and subsets of 1, 2 and 3
    unpruned = out["unpruned"]
    assert unpruned["measured"] == sum(sizes) > sum(sizes[k] for k in unpruned["selection"])


def _workers(tmp, name, fault=None):
    """Two workers of one run on localhost; (chief, worker 1) CompletedProcess-likes."""
    procs = []
    for index, config in enumerate(local_cluster(2)):
        env = dict(os.environ, TF_CONFIG=config)
        if fault is not None and index == 1:
            env[FAULT_AT_STEP_ENV] = str(fault)
        procs.append(subprocess.Popen(
            _cmd(tmp, name, "elastic_training", "--strategy", "multi_worker"), env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [(p, *p.communicate(timeout=600)) for p in procs]


def test_a_lost_worker_fails_the_run_which_resumes_to_the_steps_of_one_device(work):
    """Two workers on localhost, worker 1 killed (SIGKILL) in epoch 2: the chief stops the run
    in one line and its summary says failed.  The same command again resumes it on both; the
    run then ends as one device's on the same global batches, both workers ran the same steps
    with the same weights, the all-reduced bytes are the selected tensors', and every step the
    chief's decision is broadcast."""
    tmp = work
    (chief, out, err), (worker, _, werr) = _workers(tmp, "two_workers", fault=STEPS + 3)
    assert worker.returncode == -signal.SIGKILL, werr[-2000:]
    assert chief.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the run stopped in epoch 2: a worker of the cluster was lost")
    summary = _summary(tmp, "two_workers")
    assert summary["status"] == "failed" and len(summary["epochs"]) == 1
    (chief, out, err), (worker, _, werr) = _workers(tmp, "two_workers")
    assert chief.returncode == 0, err[-2000:]
    assert worker.returncode == 0, werr[-2000:]
    assert "resuming" in out
    summary = _summary(tmp, "two_workers")
    assert summary["status"] == "finished"
    other = json.load(open(tmp / "logs" / "two_workers" / "worker1.json"))
    assert summary["ran"] == other["ran"]  # the same steps, the same tensors, on both
    assert summary["replicas_agree"] and other["replicas_agree"]
    assert summary["replica_checksums"] == other["replica_checksums"]
    _assert_same_training(_summary(tmp, "one_elastic"), summary)
    table = json.load(open(tmp / "table.json"))
    expected, full = _expected_bytes(summary, table)
    assert summary["allreduce_bytes_per_step"] == pytest.approx(expected, rel=1e-12)
    assert summary["allreduce_bytes_per_step"] < full
    # and every step the chief's decision: float64 [step, kind, one flag per tensor]
    assert summary["decision_allreduce_bytes_per_step"] == 8 * (len(table["tensors"]) + 2)


def test_a_batch_that_does_not_divide_among_the_replicas_is_one_line_exit_2(work):
    """The one refusal that needs the strategy made (3 logical CPUs), and the exit code 2 of
    one line; the refusals before a strategy is made are tested in this process
    (tests/unit/test_distribute.py)."""
    r = subprocess.run(_cmd(work, "bad", "full_training", "--strategy", "mirrored",
                            "--logical_cpus", "3"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not divide among the 3" in lines[0], r.stderr[-2000:]


# Keras 3.3 (TensorFlow 2.16's) and later Kerases scale a replica's loss differently
@pytest.mark.parametrize("flavor", [pytest.param("keras3", marks=pytest.mark.tf_versions),
                                    "tf_keras"])
def test_elastic_callback_under_mirrored_strategy_trains_as_one_device(tmp_path, flavor):
    """model.fit with ElasticCallback inside MirroredStrategy (two logical CPUs) selects and
    trains as on one device (uncached) on the same batches, the same timing table; the
    prefix cache stays off under the strategy and says so in one line."""
    from .fit_run import fit

    script = os.path.join(ROOT, "tests", "e2e", "fit_run.py")
    uncached = ("prefix cache off (cache_frozen_prefix auto): the model's tf.distribute "
                "strategy trains on several replicas, and the cache keeps one process's rows "
                "keyed by the images of one-device batches (docs/design.md)")

    # one device in this process; only the strategy's two logical CPUs need a fresh one
    said = []
    one = fit(flavor, "one", str(tmp_path / "one"), log=said.append)
    one_summary = runlog.read_summary(str(tmp_path / "one"))
    assert not [line for line in said if line.startswith("prefix cache off")]
    table = str(tmp_path / "one" / "profiles" / os.listdir(tmp_path / "one" / "profiles")[0])
    r = subprocess.run([sys.executable, script, flavor, "mirrored", str(tmp_path / "two"), table],
                       capture_output=True, text=True, timeout=600)
    import keras

    from elastictrainer.flavors.shared import release
    if flavor == "keras3" and release(keras) < (3, 15):
        assert r.returncode != 0 and "needs Keras 3.15 or later" in r.stderr, r.stderr[-2000:]
        return
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if line.startswith("prefix cache off")] == \
        [uncached]
    two = json.loads(r.stdout.strip().splitlines()[-1])
    two_summary = runlog.read_summary(str(tmp_path / "two"))
    assert [s["mask"] for s in one_summary["selections"]] == \
        [s["mask"] for s in two_summary["selections"]]
    # a partial selection (rho clear of this tiny model's forward floor, 0.6-0.75 of its step)
    last = one_summary["selections"][-1]["mask"]
    assert 0 < sum(last) < len(last)
    for key in ("loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(one[key], two[key], rtol=1e-4, atol=1e-6)
