"""scripts/bench_fixed_selection.py: its table's gaps are full training's accuracy minus each
run's."""
from helpers import bench_fixed_selection_script as _script


def test_table_gaps_and_mean():
    script = _script()
    ratios = [{script.TIME_RATIO: 0.5, script.STEP_RATIO: 0.49},
              {script.TIME_RATIO: 0.6, script.STEP_RATIO: 0.51}]
    text = script.table(
        [{"seed": 0, "full training": 82.0, "tensors 10- fixed": 81.0, "ElasticTrainer": 80.0,
          **ratios[0]},
         {"seed": 1, "full training": 80.0, "tensors 10- fixed": 77.0, "ElasticTrainer": 80.5,
          **ratios[1]}],
        [10], elastic=True)
    assert "81.0% (1.0 under)" in text and "80.5% (0.5 over) | 0.60 | 0.510 |" in text
    assert ("| mean points under full training (negative: over) | | 2.0 (1.0 to 3.0) | "
            "0.8 (-0.5 to 2.0) | 0.55 (0.50 to 0.60) | 0.50 (0.49 to 0.51) |") in text


def test_last_epochs_table_and_swing():
    script = _script()
    last = {"full training": 81.0, "tensors 10- fixed": 78.0}
    text = script.table([{"seed": 3, "full training": 82.0, "tensors 10- fixed": 81.0,
                          script.LAST: last}], [10], elastic=False, measure=script.LAST)
    assert "| 3 | 81.0% | 78.0% (3.0 under) |" in text  # the last epochs' values, not the best
    epochs = [{"test_accuracy": a} for a in (10.0, 20.0, 30.0, 40.0, 70.0, 72.0, 66.0, 70.0)]
    # from epoch 5: 70 -> 72 -> 66 -> 70, moves of 2, 6 and 4
    assert script.swing({"epochs": epochs}) == 4.0
    assert script.swing({"epochs": epochs[:5]}) is None


def test_a_mean_that_rounds_to_zero_is_not_printed_negative():
    script = _script()
    rows = [{"seed": s, "full training": 80.0, "tensors 10- fixed": 80.0 + d,
             "ElasticTrainer": 80.0} for s, d in enumerate((0.1, -0.08))]
    text = script.table(rows, [10], elastic=False)
    assert "| 0.0 (-0.1 to 0.1) |" in text and "-0.0" not in text
