"""Training for real on a tiny model: fixed schemes train exactly their tensors, importance
restores what it probes, compiled steps are cached, every train type runs through main.py in
this process, Ctrl-C and a NaN loss end a run cleanly, energy is measured, and the closed loop
holds rho on a simulated device."""
import json
import os
import signal

import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

import main as main_cli
from elastictrainer import runlog
from elastictrainer.profiler import run as prun, table as ptable
from elastictrainer import cli, config
from elastictrainer.method import importance
from elastictrainer.runs import loop
from elastictrainer.method import schemes
from elastictrainer.train import compiled
from elastictrainer.method.roles import tensor_roles
from elastictrainer.errors import RunError

from helpers import batch, paper_taylor_by_hand, snapshot, tiny_model  # noqa: E402


# ----------------------------------------------------------------- roles and schemes
EXPECTED = {
    "full_training": {"c1/kernel:0", "c1/bias:0", "bn1/gamma:0", "bn1/beta:0", "c2/kernel:0",
                      "c2/bias:0", "head/kernel:0", "head/bias:0"},
    "prunetrain": {"c1/kernel:0", "c1/bias:0", "bn1/gamma:0", "bn1/beta:0", "c2/kernel:0",
                   "c2/bias:0", "head/kernel:0", "head/bias:0"},
    "traditional_tl_training": {"head/kernel:0", "head/bias:0"},
    "bn_plus_bias_training": {"c1/bias:0", "bn1/gamma:0", "bn1/beta:0", "c2/bias:0",
                              "head/kernel:0", "head/bias:0"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixed_schemes_train_exactly_their_tensors(name):
    model = tiny_model()
    scheme = schemes.SCHEMES[name]
    roles = tensor_roles(model)
    tr = compiled.CompiledSteps(model, keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3), scheme, roles)
    before = snapshot(tr.variables)
    tr.step_for(scheme.fixed_selection(roles))(*batch())
    changed = {v.name for v, b in zip(tr.variables, before) if not np.array_equal(v.numpy(), b)}
    assert changed == EXPECTED[name]


def test_prunetrain_adds_l1_on_kernels_only():
    x, y = batch()
    results = {}
    for name in ("full_training", "prunetrain"):
        keras.utils.set_random_seed(1)
        model = tiny_model()
        roles = tensor_roles(model)
        scheme = schemes.SCHEMES[name]
        tr = compiled.CompiledSteps(model, keras.optimizers.SGD(0.1), scheme, roles)
        w0 = snapshot(tr.variables)
        tr.step_for(scheme.fixed_selection(roles))(x, y)
        results[name] = [v.numpy() - w for v, w in zip(tr.variables, w0)]
        names = [v.name for v in tr.variables]
    for i, n in enumerate(names):
        diff = results["prunetrain"][i] - results["full_training"][i]
        if n in ("c1/kernel:0", "c2/kernel:0", "head/kernel:0"):
            # the extra step is -lr * 1e-4 * sign(w)
            np.testing.assert_allclose(np.abs(diff), 0.1 * 1e-4, rtol=1e-2, atol=1e-7)
        else:
            np.testing.assert_allclose(diff, 0, atol=1e-7)


# ----------------------------------------------------------------- importance
def _trainer(model=None, optimizer=None):
    model = model or tiny_model()
    roles = tensor_roles(model)
    return compiled.CompiledSteps(model, optimizer or keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3),
                         schemes.SCHEMES["elastic_training"], roles)


def test_importance_restores_weights_and_optimizer_state_bit_identical():
    tr = _trainer()
    for s in range(3):  # non-zero momentum and iteration count
        tr.step_for(range(len(tr.variables)))(*batch(seed=s))
    w0, o0 = snapshot(tr.variables), snapshot(tr.optimizer.variables)
    nt0 = snapshot(tr.model.non_trainable_weights)
    imp = importance.taylor_importance(tr, [batch(seed=7), batch(seed=8)])
    assert imp.shape == (len(tr.variables),) and np.all(np.isfinite(imp))
    for a, b in zip(w0, snapshot(tr.variables)):
        assert np.array_equal(a, b)
    for a, b in zip(o0, snapshot(tr.optimizer.variables)):
        assert np.array_equal(a, b)
    assert int(tr.optimizer.iterations.numpy()) == 3
    del nt0  # BN moving statistics follow the probe steps, as in any training step


def test_taylor_importance_matches_a_naive_computation():
    """I_k = -sum g(w + dw) * dw with dw one plain SGD step, computed by hand."""
    keras.utils.set_random_seed(3)
    model = tiny_model()
    tr = _trainer(model, keras.optimizers.SGD(0.05))
    x, y = batch(seed=11)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def grads():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]

    naive = paper_taylor_by_hand(model, grads, lambda g0: [-0.05 * g for g in g0])
    fast = importance.taylor_paper_importance(tr, [(x, y)])
    np.testing.assert_allclose(fast, naive, rtol=2e-2, atol=1e-9)
    assert fast[-1] > 0  # the head's update lowers the loss


def test_ablation_importances():
    tr = _trainer()
    wm = importance.weight_magnitude_importance(tr, [])
    np.testing.assert_allclose(wm, [np.abs(v.numpy()).sum() for v in tr.variables], rtol=1e-6)
    gm = importance.grad_magnitude_importance(tr, [batch()])
    assert np.all(gm >= 0) and gm.sum() > 0
    norm = importance.normalize(np.array([2.0, -4.0, 1.0]))
    np.testing.assert_allclose(norm, [0.5, -1.0, 0.25])


# ----------------------------------------------------------------- step cache
def test_step_cache_is_bounded_and_reuses_compiled_steps():
    tr = _trainer()
    tr.steps.maxsize = 3
    x, y = batch()
    n = len(tr.variables)
    selections = [tuple(range(k, n)) for k in range(n)]
    for sel in selections:
        tr.step_for(sel)(x, y)
    assert len(tr.steps) == 3 and tr.steps.traces == n
    tr.step_for(selections[-1])(x, y)  # cached: no new trace
    assert tr.steps.traces == n


# ----------------------------------------------------------------- whole runs through main.py
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    model = tiny_model(num_classes=10, size=16)
    model.save(str(d / "tiny.keras"))
    table = prun.profile_model(model, str(d / "tiny.keras"), 16, 4, 10, num_iterations=2, progress=False)
    ptable.save_table(table, str(d / "table.json"))
    return d


def _argv(workdir, train_type, run_name, *extra):
    return ["--model_name", str(workdir / "tiny.keras"), "--dataset_name", "synthetic",
            "--input_size", "16", "--weights", "none", "--num_epochs", "2", "--steps_per_epoch", "4",
            "--interval", "0.5", "--rho", "0.8", "--learning_rate", "0.01", "--train_type", train_type,
            "--timing_table", str(workdir / "table.json"), "--logdir", str(workdir / "logs"),
            "--run_name", run_name, "--economy", "false", "--head_warmup", "0",
            "--quiet"] + list(extra)


def _scalars(run):
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("train_type", sorted(schemes.SCHEMES))
def test_every_train_type_runs_and_writes_its_logs(workdir, train_type):
    from elastictrainer.machine import peak_rss_mb

    rss_before = peak_rss_mb()
    assert main_cli.main(_argv(workdir, train_type, train_type)) == 0
    rss_after = peak_rss_mb()
    run = workdir / "logs" / train_type
    cfg = json.load(open(run / runlog.CONFIG_FILE))
    assert cfg["train_type"] == train_type and cfg["seed"] == 0 and cfg["num_classes"] == 10
    summary = json.load(open(run / runlog.SUMMARY_FILE))
    for key in ("train_type", "model", "dataset", "rho", "best_test_accuracy", "train_time_s", "epochs"):
        assert key in summary
    assert summary["status"] == "finished" and len(summary["epochs"]) == 2
    assert set(summary["epochs"][0]) >= {"epoch", "train_time_s", "test_accuracy", "test_loss", "selected"}
    # the best epoch's accuracy, and the time of the epochs trained
    assert summary["best_test_accuracy"] == max(e["test_accuracy"] for e in summary["epochs"])
    assert summary["train_time_s"] == pytest.approx(summary["epochs"][-1]["train_time_s"])
    # this process's peak memory (a peak only grows), in MB as read during the run
    assert rss_before <= summary["peak_rss_mb"] <= rss_after
    acc = _scalars(run)
    tags = set(acc.Tags()["tensors"]) | set(acc.Tags()["scalars"])
    assert {runlog.TRAIN_ACCURACY, runlog.TRAIN_LOSS, runlog.LEARNING_RATE, runlog.TEST_ACCURACY,
            runlog.TEST_LOSS} <= tags
    if schemes.SCHEMES[train_type].elastic:
        assert {runlog.NUM_SELECTED, runlog.PREDICTED_RATIO, runlog.SELECTION_MASK} <= tags
        # interval 0.5 with 4 steps an epoch: a selection at steps 0, 2, 4, 6
        # (re-selections at 0, 2, 4, 6); an importance with an in-step form trains its probe
        # step first, a full step, and the selection from the next step on
        first = 0 if train_type == "elastic_training_taylor_paper" else 1
        assert [s["step"] for s in summary["selections"]] == [first, first + 2, first + 4,
                                                               first + 6]
        masks = acc.Tensors(runlog.SELECTION_MASK)
        assert len(masks) == 4 and tf.make_ndarray(masks[0].tensor_proto).shape == (8,)
        for s in summary["selections"]:
            assert s["predicted_ratio"] <= 0.8 + 1e-9
    else:
        assert summary["rho"] is None


def test_save_model_and_txt_then_weights_path_loads(workdir):
    assert main_cli.main(_argv(workdir, "full_training", "saved", "--save_model", "true",
                               "--save_txt", "1")) == 0
    run = workdir / "logs" / "saved"
    hours, best = np.loadtxt(run / "saved.txt")
    assert best == pytest.approx(json.load(open(run / runlog.SUMMARY_FILE))["best_test_accuracy"])
    from elastictrainer.models.build import build_model
    model = build_model(str(workdir / "tiny.keras"), weights=str(run / runlog.BEST_WEIGHTS_FILE))
    assert len(model.trainable_weights) == 8


def test_ctrl_c_keeps_finished_epochs_and_exits_130(workdir):
    def log(msg):
        if msg.startswith("epoch 1:"):
            os.kill(os.getpid(), signal.SIGINT)
    cfg = cli.config_from_args(cli.train_parser().parse_args(
        _argv(workdir, "full_training", "interrupted") + ["--num_epochs", "4"]))
    summary = loop.run(cfg, log=log)
    assert summary["status"] == "interrupted"
    on_disk = json.load(open(workdir / "logs" / "interrupted" / runlog.SUMMARY_FILE))
    assert on_disk["status"] == "interrupted" and 1 <= len(on_disk["epochs"]) < 4


def test_nan_loss_stops_with_a_clear_message(workdir):
    with pytest.raises(RunError, match="learning_rate"):
        main_cli.main(_argv(workdir, "full_training", "nan", "--learning_rate", "1e12",
                            "--optimizer", "adam"))
    assert json.load(open(workdir / "logs" / "nan" / runlog.SUMMARY_FILE))["status"] == "nan"


def test_ctrl_c_during_the_last_partial_batch_keeps_that_epoch(tmp_path, monkeypatch):
    """Ctrl-C during an epoch's last, partial batch keeps that epoch: every step ran, although
    fewer samples were seen than steps x batch size."""
    from helpers import write_image_folder

    folder = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5)
    calls = []
    real = compiled.CompiledSteps.step_for

    def step_for(self, selection):
        calls.append(selection)
        if len(calls) == 3:  # 8 training images at batch 3: steps of 3, 3 and 2 images
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, selection)

    monkeypatch.setattr(compiled.CompiledSteps, "step_for", step_for)
    cfg = config.Config(model_name="smallcnn", dataset_name=str(folder), input_size=16,
                        batch_size=3, weights="none", num_epochs=3, train_type="full_training",
                        logdir=str(tmp_path / "logs"), run_name="partial", progress=False)
    summary = loop.run(cfg, log=lambda msg: None)
    assert summary["steps_per_epoch"] == 3 and summary["status"] == "interrupted"
    assert [e["epoch"] for e in summary["epochs"]] == [1]  # evaluated, not dropped


def test_new_selections_in_quick_succession_log_no_retracing_warning():
    """Every selection compiles its own step, by design (TensorFlow keys its retracing detector
    on the step's code, which all selections share, and warned at 5 traces in 10 calls)."""
    import logging

    from elastictrainer.train import steps as train_steps
    from elastictrainer.flavors import optimizers

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Collect()
    tf.get_logger().addHandler(handler)
    try:
        model = tiny_model()
        opt = optimizers.prepare_optimizer(keras.optimizers.SGD(0.01), model.trainable_weights)
        for k in range(len(model.trainable_weights)):
            step = train_steps.make_train_step(model, opt, train_steps.make_loss(),
                                          model.trainable_weights[k:])
            step(*batch())
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in seen if "retracing" in m], seen


def test_a_run_measures_its_training_energy_from_a_sensor(workdir, tmp_path, monkeypatch):
    from elastictrainer.runs import energy

    rail = tmp_path / "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
    rail.mkdir(parents=True)
    (rail / "rail_name_0").write_text("VDD_IN\n")
    (rail / "in_power0_input").write_text("5000\n")  # mW: a Jetson TX2 drawing 5 W
    monkeypatch.setenv(energy.ENV_ROOT, str(tmp_path))
    assert main_cli.main(_argv(workdir, "full_training", "energy")) == 0
    run = workdir / "logs" / "energy"
    summary = json.load(open(run / runlog.SUMMARY_FILE))
    assert summary["energy_source"] == "jetson-tx2-ina3221x:VDD_IN"
    assert summary["avg_power_w"] == pytest.approx(5.0)
    assert summary["energy_j"] > 0 and summary["epochs"][-1]["energy_j"] == summary["energy_j"]
    # training time only: the meter is paused while the test split is evaluated
    assert summary["energy_j"] / 5.0 <= summary["train_time_s"] * 1.05 + 0.05
    _, energies = runlog.read_scalars(str(run), runlog.ENERGY_JOULES)
    assert len(energies) == 2 and energies[0] < energies[1]


def test_no_sensor_gives_null_energy_with_the_reason(workdir, tmp_path, monkeypatch):
    from elastictrainer.runs import energy

    monkeypatch.setenv(energy.ENV_ROOT, str(tmp_path))  # an empty tree: no sensor at all
    monkeypatch.setattr(energy, "_nvml", lambda: (None, "NVML not installed"))
    assert main_cli.main(_argv(workdir, "full_training", "no_energy")) == 0
    summary = json.load(open(workdir / "logs" / "no_energy" / runlog.SUMMARY_FILE))
    assert summary["energy_j"] is None and summary["avg_power_w"] is None
    assert summary["energy_source"].startswith("no sensor: no INA3221 rails")


def _fake_device(monkeypatch, truth, slow=None, every=None, timed_full=None):
    """A simulated device on a fake clock, for runs through _run_on: every train step of a
    selection advances the clock by what `truth` (a TimeModel) says that selection costs,
    times slow(n) for the n-th call of a partial selection's steps (a burst of other load),
    and times every(n) for the n-th training step of any kind; a full step (the probe or
    timed full step of the elastic runtime, without its update) after n training steps takes
    timed_full(n) times its cost.  Returns (clock, that step counter [n]) for a test to start again."""
    clock = [0.0]
    calls = [0]
    steps = [0]
    real_step_for = compiled.CompiledSteps.step_for
    real_probe = compiled.CompiledSteps.probe_step

    def advance(ms, factor):
        steps[0] += 1
        factor *= every(steps[0]) if every else 1.0
        clock[0] += ms * factor / 1e3

    def step_for(self, selection):
        step = real_step_for(self, selection)
        mask = np.zeros(len(self.variables), bool)
        mask[list(selection)] = True
        ms = truth.t_fp + truth.cost_ms(mask)
        partial = not mask.all()

        def timed(x, y):
            factor = 1.0
            if partial:
                calls[0] += 1
                factor = slow(calls[0]) if slow else 1.0
            advance(ms, factor)
            return step(x, y)
        return timed

    def probe_step(self, x, y, want_terms):
        factor = timed_full(steps[0]) if timed_full else 1.0
        # without its update (a probe or timed full step) the step is cheaper, as the table says
        advance(truth.t_full / truth.full_over_grads, factor)
        return real_probe(self, x, y, want_terms)

    monkeypatch.setattr(compiled.CompiledSteps, "step_for", step_for)
    monkeypatch.setattr(compiled.CompiledSteps, "probe_step", probe_step)
    return (lambda: clock[0]), steps


def _run_on(clock, argv):
    """A training run as main.py would do it with `argv`, timed by `clock`."""
    from elastictrainer import cli
    from elastictrainer.runs import loop
    cfg = cli.config_from_args(cli.train_parser().parse_args(argv))
    return loop.run(cfg, log=lambda msg: None, clock=clock)


def _realistic_table(workdir, name):
    """The tiny model's table with times as a real CNN's (forward 0.35 of a step, the update
    0.1; at 16 px the tiny model's own step is nearly all overhead), no calibration."""
    data = json.load(open(workdir / "table.json"))
    rng = np.random.default_rng(0)
    for t in data["tensors"]:
        t["t_dw_ms"], t["t_dy_ms"] = float(rng.uniform(1, 4)), float(rng.uniform(1, 4))
    backward = sum(t["t_dw_ms"] + t["t_dy_ms"] for t in data["tensors"])
    data["t_fp_ms"] = 0.35 / 0.65 * backward
    data["t_full_ms"] = data["t_fp_ms"] + backward
    data["t_grads_ms"] = 0.9 * data["t_full_ms"]  # the update, a tenth of a step
    data.pop("calibration", None)
    # nor the trace's forward time by layer, which prices the prefix cache's cuts (--cache_
    # frozen_prefix auto): timed on a busy machine it varies from one profile to the next;
    # without it the cuts are priced by their FLOPs alone, the same every time
    data.pop("t_fp_layers_ms", None)
    data.pop("t_fp_ops_ms", None)
    path = workdir / name
    json.dump(data, open(path, "w"))
    return path, data


def test_a_burst_of_load_in_one_measurement_round_is_not_corrected(workdir, monkeypatch):
    """The table is right, but the selection's first timed steps run 1.5x slow (other load):
    the first round misses rho, the pooled rounds do not, and nothing is corrected."""
    from elastictrainer.method.time_model import TimeModel
    path, data = _realistic_table(workdir, "right_table.json")
    args = ("--steps_per_epoch", "32", "--num_epochs", "1", "--interval", "1",
            "--timing_table", str(path))
    # a rho that the first selection fills exactly (a tiny model's tensors are coarse): its
    # predicted ratio at 0.75, feedback off
    clock, counter = _fake_device(monkeypatch, TimeModel(data))
    _run_on(clock, _argv(workdir, "elastic_training", "burst_rho", "--rho", "0.75",
                               "--rho_feedback", "false", *args))
    rho = json.load(open(workdir / "logs" / "burst_rho" / runlog.SUMMARY_FILE)
                    )["selections"][0]["predicted_ratio"] * 1.01  # the DP rounds costs up
    # calls 2-7 of the partial selection's step (its first is untimed): 6 of the 10 steps of
    # round one, 6 of the 20 pooled
    clock, counter = _fake_device(monkeypatch, TimeModel(data), slow=lambda n: 1.5 if 2 <= n <= 7 else 1.0)
    _run_on(clock, _argv(workdir, "elastic_training", "burst", "--rho", f"{rho:.9f}",
                               *args))
    summary = json.load(open(workdir / "logs" / "burst" / runlog.SUMMARY_FILE))
    assert summary["corrections"] == []
    (sel,) = summary["selections"]
    # 32 steps: the probe, then the selection's own steps and the full steps timed among them
    assert 1 + sel["steps"] + sel["full_steps"] == 32 and sel["limited_by"] == "budget"
    assert sel["measured_ratio"] == pytest.approx(sel["predicted_ratio"], rel=1e-6)
    # without the burst in round one... with it and one round only, it would have been a miss
    assert 1.5 * sel["predicted_ratio"] > rho * 1.05


@pytest.mark.parametrize("recheck", [30, 10**6])
def test_a_selection_is_measured_again_and_a_later_drift_corrected(workdir, monkeypatch,
                                                                    recheck):
    """The table is right when the selection is judged; from its 25th step on, its steps run
    1.4x slow (other load that hits the small steps).  Measured again RECHECK_STEPS steps
    after the first judgement, the drift is a confirmed miss and is corrected; never measured
    again (10**6), the run keeps the drifted selection."""
    from elastictrainer.elastic import closed_loop
    from elastictrainer.method.time_model import TimeModel
    path, data = _realistic_table(workdir, "drift_table.json")
    args = ("--steps_per_epoch", "90", "--num_epochs", "1", "--interval", "1",
            "--timing_table", str(path))
    clock, counter = _fake_device(monkeypatch, TimeModel(data))
    name = f"drift_rho_{recheck}"
    _run_on(clock, _argv(workdir, "elastic_training", name, "--rho", "0.75",
                               "--rho_feedback", "false", *args))
    rho = json.load(open(workdir / "logs" / name / runlog.SUMMARY_FILE)
                    )["selections"][0]["predicted_ratio"] * 1.01  # the DP rounds costs up
    monkeypatch.setattr(closed_loop, "RECHECK_STEPS", recheck)
    clock, counter = _fake_device(monkeypatch, TimeModel(data), slow=lambda n: 1.4 if n >= 25 else 1.0)
    name = f"drift_{recheck}"
    _run_on(clock, _argv(workdir, "elastic_training", name, "--rho", f"{rho:.9f}",
                               *args))
    summary = json.load(open(workdir / "logs" / name / runlog.SUMMARY_FILE))
    first = summary["selections"][0]
    if recheck > 90:
        assert summary["corrections"] == [] and len(summary["selections"]) == 1
        # measured only in its first window, before the drift: no full step ran beside the
        # drifted steps, so nothing in the run measured it (what the re-check is for)
        assert first["measured_ratio"] == pytest.approx(rho / 1.01, rel=1e-6)
        return
    (correction, *_) = summary["corrections"]
    assert correction["miss"] == "over"
    # judged fine after its first 10 timed steps, measured again 30 steps later, confirmed
    # after its probe step and its first (compiling) step; a round is 10 of its steps and the
    # 5 full steps interleaved with them
    assert correction["step"] == 1 + 1 + (10 + 5) + recheck + 2 * (10 + 5) - 1
    assert 1 + first["steps"] + first["full_steps"] == correction["step"] + 1
    # its first window measured it within rho, its latest over: it is no candidate any more
    # (rho_control.prefer_measured), so the correction trains something else
    second = summary["selections"][1]
    assert second["mask"] != first["mask"] and second["measured_before"] is None


@pytest.mark.parametrize("feedback", ["true", "false"])
def test_rho_feedback_measures_and_corrects_a_wrong_table(workdir, monkeypatch, feedback):
    from elastictrainer.method.time_model import TimeModel
    path, data = _realistic_table(workdir, f"wrong_table_{feedback}.json")
    table = TimeModel(data)
    # the device: backward ops 40% cheaper than profiled, the difference a fixed per-step cost
    # the table missed, so every partial selection costs more of a step than predicted
    truth = table.corrected(0.6, 0.6)
    rho = 0.75
    assert truth.rho_floor < rho * 0.9
    clock, counter = _fake_device(monkeypatch, truth)
    name = f"feedback_{feedback}"
    # uncached: the fake device prices a selection's step as `truth` does, without a cut (the
    # cache's own closed loop is test_prefix_cache.py's)
    _run_on(clock, _argv(workdir, "elastic_training", name, "--steps_per_epoch", "32",
                         "--interval", "1", "--rho", str(rho), "--cache_frozen_prefix", "false",
                         "--rho_feedback", feedback, "--timing_table", str(path)))
    run = workdir / "logs" / name
    summary = json.load(open(run / runlog.SUMMARY_FILE))
    sels = summary["selections"]
    assert summary["rho_feedback"] is (feedback == "true")
    assert sels[0]["measured_ratio"] is not None
    for s in [s for s in sels if s["measured_ratio"] is not None]:
        assert s["limited_by"] in ("budget", "importance", "depth", "forward floor")
        assert s["steps"] > 0
        mask = np.array(s["mask"], bool)
        assert s["measured_ratio"] == pytest.approx(truth.predicted_ratio(mask), rel=1e-6)
    judged = [s for s in sels if s["measured_ratio"] is not None and s["steps"]]
    weights = np.array([s["steps"] for s in judged])
    ratios = np.array([s["measured_ratio"] for s in judged])
    assert summary["measured_ratio"] == pytest.approx(float(weights @ ratios / weights.sum()))
    parts = summary["reselection_overhead_parts_s"]
    assert set(parts) == {"importance", "timing full steps", "compiling", "solving"}
    assert sum(parts.values()) == pytest.approx(summary["reselection_overhead_s"])
    # on the fake device only steps take time: compiling and solving cost nothing on its
    # clock, and the importance is a whole number of probe steps
    assert parts["compiling"] == pytest.approx(0.0, abs=1e-9) and parts["solving"] == 0.0
    probes = parts["importance"] / (truth.t_full / truth.full_over_grads / 1e3)
    assert probes >= 1 and probes == pytest.approx(round(probes))
    tags = set(_scalars(run).Tags()["tensors"]) | set(_scalars(run).Tags()["scalars"])
    assert runlog.MEASURED_RATIO in tags
    over = [s for s in sels if s["reason"] == "interval" and s["measured_ratio"] > rho * 1.05]
    if feedback == "false":
        assert summary["corrections"] == [] and all(s["reason"] == "interval" for s in sels)
        assert over  # the wrong table misses rho, and nothing corrects it
        return
    assert summary["corrections"] and runlog.CORRECTIONS in tags
    for c in summary["corrections"]:
        assert c["miss"] in ("over", "under") and c["dw_scale"] > 0 and c["dy_scale"] > 0
    # once corrected, no selection runs above 1.1 rho
    first = sels.index(next(s for s in sels if s["reason"].startswith("correction")))
    assert all(s["measured_ratio"] <= rho * 1.1 for s in sels[first:]
               if s["measured_ratio"] is not None)


def test_wall_ratio_is_the_time_a_full_training_run_takes(workdir, monkeypatch):
    """summary.json's wall_ratio, estimated inside the elastic run, equals the elastic run's
    training time over a full-training run's on the same (fake) device, whose loop spends 3 ms
    a step outside the compiled step: that loop work does not shrink with rho, so the wall
    clock ratio is above the step ratio.  One step in 7 runs 2.5x slow (other load), in both
    runs alike, and full steps are timed only between those: the medians miss the slow steps,
    which full training pays too."""
    import tqdm as tqdm_mod
    from elastictrainer.method.time_model import TimeModel
    path, data = _realistic_table(workdir, "wall_table.json")
    truth = TimeModel(data)
    # no selection's first step is a slow one (those would pass for compiling)
    device_clock, counter = _fake_device(monkeypatch, truth,
                                         every=lambda n: 2.5 if n % 7 == 3 else 1.0)
    loop_work = [0.0]

    def clock():
        return device_clock() + loop_work[0]

    class Bar(tqdm_mod.tqdm):  # the loop's per-step work, 3 ms on the fake clock
        def update(self, n=1):
            loop_work[0] += 3e-3
            return super().update(n)

    monkeypatch.setattr(tqdm_mod, "tqdm", Bar)
    times = {}
    for train_type in ("full_training", "elastic_training"):
        name = f"wall_{train_type}"
        counter[0] = 0  # the slow steps at the same steps of both runs
        _run_on(clock, _argv(workdir, train_type, name, "--steps_per_epoch", "48",
                             "--interval", "1", "--rho", "0.6", "--rho_feedback", "false",
                             "--timing_table", str(path)))
        times[train_type] = json.load(open(workdir / "logs" / name / runlog.SUMMARY_FILE))
    elastic = times["elastic_training"]
    actual = elastic["train_time_s"] / times["full_training"]["train_time_s"]
    assert elastic["wall_ratio"] == pytest.approx(actual, rel=1e-6)
    assert elastic["wall_ratio"] > elastic["measured_ratio"] + 0.01
    tags = set(_scalars(workdir / "logs" / "wall_elastic_training").Tags()["tensors"])
    assert runlog.WALL_RATIO in tags
    assert elastic["reselection_overhead_s"] > 0


def test_load_while_a_selection_is_first_measured_is_not_taken_for_the_full_steps_cost(
        workdir, monkeypatch):
    """Other load makes the run's steps 2-12 1.6x slow, full steps timed among them
    included (the input pipeline filling its buffers at the start of a run, say): the
    selection's own and full steps measured side by side give the true ratio, and the run's
    wall-clock estimate is what a full-training run under the same load takes.  Had the
    selection's later, unloaded steps been set against the loaded full steps of its first
    window, its ratio would come out 1.6x low and full training's time as much too long."""
    from elastictrainer.method.time_model import TimeModel
    path, data = _realistic_table(workdir, "load_table.json")
    truth = TimeModel(data)
    # not the probe step nor the selection's first, which the runtime takes for compiling
    load = lambda n: 1.6 if 2 <= n < 13 else 1.0  # noqa: E731
    # full steps are training steps: the load hits them as it hits the selection's
    clock, counter = _fake_device(monkeypatch, truth, every=lambda n: load(n - 1))
    times = {}
    for train_type in ("full_training", "elastic_training"):
        name = f"load_{train_type}"
        counter[0] = 0
        _run_on(clock, _argv(workdir, train_type, name, "--steps_per_epoch", "40",
                             "--num_epochs", "1", "--interval", "1", "--rho", "0.6",
                             "--rho_feedback", "false", "--timing_table", str(path)))
        times[train_type] = json.load(open(workdir / "logs" / name / runlog.SUMMARY_FILE))
    elastic = times["elastic_training"]
    (selection,) = elastic["selections"]  # 40 steps, 11 of them loaded
    assert selection["measured_ratio"] == pytest.approx(
        truth.predicted_ratio(np.array(selection["mask"], bool)), rel=1e-6)
    actual = elastic["train_time_s"] / times["full_training"]["train_time_s"]
    assert elastic["wall_ratio"] == pytest.approx(actual, rel=1e-6)


def test_num_train_and_num_test_size_the_synthetic_dataset(workdir):
    assert main_cli.main(_argv(workdir, "full_training", "sized", "--num_train", "24",
                               "--num_test", "40", "--steps_per_epoch", "100")) == 0
    summary = json.load(open(workdir / "logs" / "sized" / runlog.SUMMARY_FILE))
    assert summary["steps_per_epoch"] == 24 // 4  # every epoch one pass over the 24 images
    cfg = json.load(open(workdir / "logs" / "sized" / runlog.CONFIG_FILE))
    assert (cfg["num_train"], cfg["num_test"]) == (24, 40)
    # accuracies on 40 test images are multiples of 2.5%
    assert all(abs(e["test_accuracy"] / 2.5 - round(e["test_accuracy"] / 2.5)) < 1e-6
               for e in summary["epochs"])


def test_a_probe_step_trains_nothing_and_gives_the_taylor_importance():
    """The elastic runtime's probe (and timed full) step computes every tensor's gradient and
    returns the Taylor terms that the separate probe (importance.taylor_importance) computes,
    but changes no weight and no optimizer state: an elastic run trains its selections only."""
    from elastictrainer.method import importance
    from elastictrainer.flavors.optimizers import make_optimizer
    x, y = batch()

    def fresh():
        keras.utils.set_random_seed(0)
        model = tiny_model()
        opt = make_optimizer("sgd", 0.1, 5e-4, 100)
        return model, opt, compiled.CompiledSteps(model, opt, schemes.SCHEMES["elastic_training"],
                                           tensor_roles(model))

    expected = importance.taylor_importance(fresh()[2], [(x, y)])
    model, opt, tr = fresh()
    assert tr.in_step
    before = snapshot(model.trainable_weights + opt.variables)
    _, _, terms = tr.probe_step(x, y, True)
    np.testing.assert_allclose(terms.numpy(), expected, rtol=1e-5, atol=1e-12)
    _, _, none = tr.probe_step(x, y, False)
    assert not np.any(none.numpy())  # not asked: not computed
    for a, b in zip(before, snapshot(model.trainable_weights + opt.variables)):
        np.testing.assert_array_equal(a, b)


def test_rho_auto_keeps_its_share_of_the_importance_and_says_the_ratio_it_took(workdir):
    """--rho auto on the command line: every selection keeps --rho_share of the positive
    importance its probe measured, is held to the ratio it amounts to (recorded per selection
    and in TensorBoard), and the closing line says what was asked."""
    lines = []
    from elastictrainer import cli
    from elastictrainer.runs import loop
    argv = _argv(workdir, "elastic_training", "auto", "--rho_share", "0.6",
                 "--head_warmup", "0.5")
    argv[argv.index("--rho") + 1] = "auto"
    cfg = cli.config_from_args(cli.train_parser().parse_args(argv))
    assert cfg.rho == "auto" and cfg.rho_share == 0.6
    summary = loop.run(cfg, log=lines.append)
    assert summary["status"] == "finished" and summary["rho"] == "auto"
    # the head warm-up first: the output layer's tensors alone, then the probes' selections
    warmup, *selections = summary["selections"]
    assert warmup["reason"] == "head warm-up" and warmup["steps"] >= 1
    assert warmup["mask"] == [0] * (len(warmup["mask"]) - 2) + [1, 1]
    assert selections
    for s in selections:
        importance = np.asarray(s["importance"])
        mask = np.asarray(s["mask"], bool)
        assert s["limited_by"] == "share" and s["objective"] == "share"
        assert importance[mask].sum() >= 0.6 * importance[importance > 0].sum() * (1 - 1e-9)
        assert s["rho"] == pytest.approx(s["predicted_ratio"])
        # why: the share it keeps, and the cheapest keeping it with another deepest tensor
        assert s["importance_share"] == pytest.approx(
            importance[mask].sum() / importance[importance > 0].sum())
        if s["runner_up"] is not None:
            assert s["runner_up"]["importance_share"] >= 0.6 * (1 - 1e-9)
    assert any("step-time ratio asked auto (60% of the estimated loss drop)" in line
               for line in lines)
    assert any(line.startswith("rho auto (share 60%)") for line in lines)
    acc = _scalars(workdir / "logs" / "auto")
    tags = set(acc.Tags()["scalars"]) | set(acc.Tags()["tensors"])
    assert {runlog.SELECTION_RHO, runlog.SELECTION_IMPORTANCE_SHARE} <= tags
