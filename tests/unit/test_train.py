"""Training's pieces that need no training: tensor roles, the time model on a made-up table,
the settings refused in one line (also by main.py's entry point, in this process, with exit
code 2), an unwritable --logdir refused before any data loads, the registered schemes,
and the filter that drops TensorFlow's retracing warning."""
import numpy as np
import pytest

import tensorflow as tf

from elastictrainer import config
from elastictrainer.method import schemes
from elastictrainer.method import time_model
from elastictrainer.errors import UserError
from elastictrainer.method.roles import tensor_roles
from elastictrainer.runs import setup as run_setup
from elastictrainer.train import distribution
from helpers import script_cli, tiny_model


# ----------------------------------------------------------------- roles and schemes
def test_tensor_roles_are_rules_over_layers():
    model = tiny_model()
    roles = dict(zip([v.name for v in model.trainable_weights], tensor_roles(model)))
    assert roles == {"c1/kernel:0": "kernel", "c1/bias:0": "bias", "bn1/gamma:0": "norm",
                     "bn1/beta:0": "norm", "c2/kernel:0": "kernel", "c2/bias:0": "bias",
                     "head/kernel:0": "head", "head/bias:0": "head"}


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(UserError) as e:
        config.Config(train_type="elastic").validate()
    for name in schemes.SCHEMES:
        assert name in str(e.value)


# ----------------------------------------------------------------- time model
def fake_table(model, t_fp=10.0, t_full=30.0):
    n = len(model.trainable_weights)
    return {"t_fp_ms": t_fp, "t_full_ms": t_full, "tensors": [
        {"name": v.name, "t_dw_ms": 1.0 + (n - 1 - k), "t_dy_ms": 0.5, "estimated": False,
         "rank": n - 1 - k}
        for k, v in enumerate(model.trainable_weights)]}


def test_time_model_predicts_full_step_and_selection_fits_rho():
    model = tiny_model()
    tm = time_model.TimeModel(fake_table(model))
    n = len(model.trainable_weights)
    assert tm.predicted_ratio(np.ones(n, bool)) == pytest.approx(1.0)
    assert tm.predicted_ratio(np.zeros(n, bool)) == pytest.approx(tm.rho_floor)
    rng = np.random.default_rng(0)
    for rho in (0.4, 0.5, 0.7, 0.9):
        imp = rng.uniform(0.1, 1.0, n)
        mask = tm.select(imp, rho)
        assert tm.predicted_ratio(mask) <= rho + 1e-9
        assert mask.any()
    # training only the output-most tensor costs its t_dw plus the first t_dy
    head_bias = n - 1
    mask = np.zeros(n, bool)
    mask[head_bias] = True
    scale = 20.0 / sum(1.0 + k + 0.5 for k in range(n))
    assert tm.cost_ms(mask) == pytest.approx(scale * (1.0 + 0.5))
    # the deepest tensor pays every t_dy above it
    mask = np.zeros(n, bool)
    mask[0] = True
    assert tm.cost_ms(mask) == pytest.approx(scale * (1.0 + (n - 1) + 0.5 * n))


def test_rho_validation():
    for rho in (0.0, -0.5, 1.5):
        with pytest.raises(UserError, match="rho"):
            config.Config(rho=rho).validate()
    with pytest.raises(UserError, match="interval"):
        config.Config(interval=0).validate()
    with pytest.raises(UserError, match="num_epochs"):
        config.Config(num_epochs=-1).validate()


# What main.py refuses once its flags parsed (the parsing's own refusals are test_config.py's).
# A bad rho, num_epochs or scheme is refused above, an unknown dataset in test_data.py, bad cache
# settings in test_prefix_time_model.py: the same Config.validate and load_dataset calls.
@pytest.mark.parametrize("args,needle", [
    (["--dataset_name", "oxford_iiit_pet", "--num_train", "100"], "generated datasets only"),
    # an unknown name is what is wrong, not the flag that sizes it
    (["--dataset_name", "nosuchdata", "--num_train", "100"], "unknown dataset 'nosuchdata'"),
    (["--dataset_name", "synthetic", "--num_test", "0"], "num_test"),
    (["--rho", "auto", "--rho_share", "0"], "--rho_share"),
    (["--rho", "auto", "--rho_share", "1.5"], "--rho_share"),
])
def test_bad_settings_are_one_line_and_exit_2(args, needle, capsys, monkeypatch):
    """main.py's entry point, in this process, refuses them in one stderr line with exit code 2
    before the process is prepared for TensorFlow."""
    # a setting let through would start a run: stop it at the first step past the checks
    monkeypatch.setattr(distribution, "prepare_process", lambda cfg: pytest.fail("went on"))
    code, _, err = script_cli("main", ["--weights", "none", "--quiet"] + args, capsys)
    assert code == 2 and len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("logdir,needle", [("/proc/x", "--logdir /proc/x: cannot write there"),
                                           ("FILE", "cannot write there")])
def test_an_unwritable_logdir_is_one_line_and_exit_2_before_any_data_loads(
        tmp_path, logdir, needle, capsys, monkeypatch):
    if logdir == "FILE":
        (tmp_path / "afile").write_text("x")
        logdir = str(tmp_path / "afile")
    # the logdir is checked before minutes of loading and profiling (runs/setup.py)
    monkeypatch.setattr(run_setup, "load_dataset", lambda *a, **kw: pytest.fail("data loaded"))
    code, _, err = script_cli("main", ["--dataset_name", "synthetic", "--logdir", logdir,
                                       "--model_name", "smallcnn", "--weights", "none",
                                       "--train_type", "full_training", "--quiet"], capsys)
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_help_lists_every_registered_scheme():
    assert set(tuple(schemes.SCHEMES)) == set(schemes.SCHEMES)


def test_retracing_warning_is_dropped_and_nothing_else():
    import logging

    from elastictrainer.flavors.tf_setup import DropRetracingWarning

    filt = DropRetracingWarning()
    record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1,
                               "5 out of the last 5 calls to <function f> triggered "
                               "tf.function retracing. Tracing is expensive", None, None)
    other = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, "something else",
                              None, None)
    assert not filt.filter(record) and filt.filter(other)
    assert any(isinstance(f, DropRetracingWarning) for f in tf.get_logger().filters)
