"""compare.py's table: the accuracy of a run's last epochs."""
import pytest

from elastictrainer.experiments import compare


@pytest.mark.parametrize("epochs,expected", [([], None), ([70.0], 70.0),
                                             ([10.0, 50.0, 60.0, 70.0], 60.0)])
def test_last_epochs_accuracy(epochs, expected):
    summary = {"epochs": [{"test_accuracy": a} for a in epochs]}
    assert compare.last_epochs_accuracy(summary) == expected
