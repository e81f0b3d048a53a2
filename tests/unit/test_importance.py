"""Tensor importance (importance.py): each elastic scheme names its estimate, and both are
registered; what the estimates share."""
import pytest

from elastictrainer.method import importance
from elastictrainer.method import schemes


def test_schemes_name_both_estimates():
    assert schemes.SCHEMES["elastic_training"].importance == "taylor"
    assert schemes.SCHEMES["elastic_training_taylor_paper"].importance == "taylor_paper"
    assert {"taylor", "taylor_paper"} <= set(importance.IMPORTANCE)


def test_a_strategy_is_refused_what_takes_one_devices_batch_twice():
    class Curvature:
        needs_batch = True

    def first_order(grads):
        return grads

    assert importance.one_device_only(first_order, "--train_type elastic_training") is None
    assert importance.one_device_only(first_order, "--train_type x", None) is None
    assert importance.one_device_only(Curvature(), "--train_type c") == (
        "--train_type c takes a second gradient on one device's batch")
    assert importance.one_device_only(first_order, "t", "--trial_check") == (
        "--trial_check steps on one device's batch")
    both = importance.one_device_only(Curvature(), "--train_type c", "--trial_check")
    assert both == ("--train_type c takes a second gradient and --trial_check steps on one "
                    "device's batch")


def test_a_steady_step_is_as_long_as_momentum_makes_it():
    class SGD:
        def __init__(self, momentum):
            self.momentum = momentum

    assert importance.momentum_stretch(SGD(0.9)) == pytest.approx(10.0)
    assert importance.momentum_stretch(SGD(0.0)) == 1.0
    assert importance.momentum_stretch(object()) == 1.0  # Adam: no momentum attribute
    assert importance.momentum_stretch(SGD(1.5)) == 1.0  # no steady length
