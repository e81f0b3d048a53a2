"""The line a run ends with (runs/recorder.closing_line)."""
from types import SimpleNamespace

from elastictrainer.runs.recorder import closing_line


def _summary(epochs, best):
    return SimpleNamespace(train_time_s=30.0, best_test_accuracy=best, energy_j=None,
                           energy_source=None, epochs=epochs)


def test_a_run_stopped_before_any_tested_epoch_says_so_not_zero_percent():
    cfg = SimpleNamespace(train_type="elastic_training", num_epochs=4)
    line = closing_line(cfg, _summary([], None), stopped=True, out="logs/r")
    assert line.startswith("elastic_training interrupted after 0 of 4 epochs (run the same "
                           "command again to continue): no epoch tested yet, training time")
    tested = _summary([{"epoch": 1, "test_accuracy": 61.5}], 61.5)
    assert ": best test accuracy 61.50%, training time" in closing_line(
        cfg, tested, stopped=True, out="logs/r")
