"""Time to accuracy (experiments/time_to_accuracy.py) on scripted curves."""
from elastictrainer.experiments import time_to_accuracy as tta


def _summary(points):
    return {"epochs": [{"train_time_s": t, "test_accuracy": a} for t, a in points]}


def test_curve_time_to_and_levels():
    c = tta.curve(_summary([(10, 50.0), (20, 79.0), (30, 81.0)]), offset_s=5)
    assert c == [(15, 50.0), (25, 79.0), (35, 81.0)]
    assert tta.time_to(c, 79.0) == 25 and tta.time_to(c, 90.0) is tta.NEVER


def test_speedups_over_full_training_and_never():
    full = [[(10, 60.0), (20, 78.0), (30, 80.0)], [(10, 70.0), (20, 80.0), (30, 79.0)]]
    fast = [[(4, 70.0), (8, 79.5), (12, 79.9)], [(4, 79.3), (8, 79.0), (12, 79.0)]]
    slow = [[(5, 40.0), (10, 50.0), (15, 60.0)], [(5, 40.0), (10, 50.0), (15, 60.0)]]
    out = tta.summarize({"full_training": full, "fast": fast, "slow": slow})
    # seed levels from each seed's full run (best 80 both): 95% = 76, 99% = 79.2, 1 pt = 79
    assert out["full_training"]["p95"]["per_seed_s"] == [20, 20]
    assert out["fast"]["p95"]["per_seed_s"] == [8, 4]
    assert out["fast"]["p95"]["speedup"] == 20 / 6  # medians 20 and 6
    assert out["fast"]["p99"]["per_seed_s"] == [8, 4]
    assert out["fast"]["pt1"]["per_seed_s"] == [8, 4]
    assert out["slow"]["p95"]["time_s"] is tta.NEVER and out["slow"]["p95"]["speedup"] is None
    assert out["fast"]["best_accuracy"] == (79.9 + 79.3) / 2
    text = tta.table(out, {"fast": "Fast"})
    assert "| Fast | 2 |" in text and "never" in text.splitlines()[-1]


def test_a_seed_that_never_gets_there_counts_as_latest():
    assert tta._median([5.0, tta.NEVER, 7.0]) == 7.0
    assert tta._median([5.0, tta.NEVER, tta.NEVER]) is tta.NEVER


def test_a_refused_scheme_is_a_row_that_says_why():
    full = [[(10, 60.0), (20, 80.0)]]
    out = tta.summarize({"full_training": full, "low": [tta.Refused("--rho 0.3 is below the floor")]})
    assert out["low"] == {"runs": 1, "refused": "--rho 0.3 is below the floor"}
    row = tta.table(out).splitlines()[-1]
    assert row.startswith("| low | 1 | refused: --rho 0.3 is below the floor |")
    assert row.count("|") == tta.table(out).splitlines()[0].count("|")


def test_a_fit_runs_clock_counts_the_setup_before_its_first_epoch_and_not_validation():
    """What ElasticCallback does in on_train_begin (its first profiling) is part of the run's
    time; the validation after each epoch's last batch is not."""
    import keras

    from elastictrainer.experiments.fit_task import epoch_clock

    now = iter([0.0, 5.0, 7.0, 9.0, 12.0, 20.0, 23.0]).__next__
    clock = epoch_clock(keras, clock=now)
    clock.on_train_begin()           # 0: then 5 s of profiling
    for epoch in range(2):
        clock.on_epoch_begin(epoch)  # 5, 12
        clock.on_train_batch_end(0)  # 7, 20
        clock.on_train_batch_end(1)  # 9, 23
        clock.on_epoch_end(epoch, {"val_accuracy": 0.5 + epoch / 4})  # validation: 9 -> 12
    assert clock.points == [(9.0, 50.0), (20.0, 75.0)]


def test_a_benchmarks_elastic_fit_starts_from_nothing_profiled(tmp_path):
    """fit_task.first_run_callback: the run's folder emptied, its table under it, and no table
    kept in the process from a run before."""
    from elastictrainer.experiments.fit_task import first_run_callback
    from elastictrainer.profiler import reuse

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")  # a run before, in the same folder
    reuse._TABLES["a table"] = {}
    callback = first_run_callback(str(run), rho=0.3)
    assert not run.exists() and not reuse._TABLES
    assert callback.profiles == str(run / "profiles") and callback.cfg.rho == 0.3
