"""Tensor importance (importance.py): each elastic scheme names its estimate, and both are
registered."""
from elastictrainer.method import importance
from elastictrainer.method import schemes


def test_schemes_name_both_estimates():
    assert schemes.SCHEMES["elastic_training"].importance == "taylor"
    assert schemes.SCHEMES["elastic_training_taylor_paper"].importance == "taylor_paper"
    assert {"taylor", "taylor_paper"} <= set(importance.IMPORTANCE)
