"""The prefix cache benchmark: its tables from the rows its runs give
(experiments/prefix_cache_report.py), and its command line (scripts/bench_prefix_cache.py)."""
from elastictrainer.experiments import prefix_cache_report as report
from helpers import load_script


def row(seed, run, rho, best, time_ratio, **kw):
    base = {"seed": seed, "run": run, "rho": rho, "cache": "cache" in run, "best": best,
            "last3": best - 1, "train_time_s": 100 * time_ratio, "time_ratio": time_ratio,
            "wall_ratio": None, "step_ratio": None, "cuts": [], "served_share": None,
            "fill_s": None, "cache_mb": None, "tensors": 20, "load": [1.0, 2.0]}
    return {**base, **kw}


def test_the_mean_table_sets_each_run_against_its_seeds_full_training():
    rows = [row(0, "full training", None, 80.0, 1.0), row(1, "full training", None, 82.0, 1.0),
            {"seed": 0, "run": "ElasticTrainer", "rho": 0.3, "cache": False, "error": "floor"},
            row(0, "ElasticTrainer + cache", 0.3, 79.0, 0.3, step_ratio=0.2, tensors=10,
                cuts=["stage2_block2_conv"], served_share=0.9, fill_s=3.0),
            row(1, "ElasticTrainer + cache", 0.3, 80.0, 0.4, step_ratio=0.3)]
    means = report.means_table(rows).splitlines()
    assert means[2] == "| full training |  | 2 | 81.0% | 0.0 | 80.0% | 1.00 |  |"
    assert means[3].startswith("| ElasticTrainer | 0.3 | | refused")
    # 1.0 and 2.0 points under, times 0.3 and 0.4
    assert means[4] == "| ElasticTrainer + cache | 0.3 | 2 | 79.5% | 1.5 | 78.5% | 0.35 | 0.25 |"
    each = report.runs_table(rows).splitlines()
    assert each[5] == ("| 0 | ElasticTrainer + cache | 0.3 | 79.0% | 78.0% | 30.0 s | 0.30 |  | "
                       "0.20 | 10/20 | stage2_block2_conv | 90% | 3.0 s | 1.0-2.0 |")


def test_the_resnet50_table_gives_both_ratios_with_their_predictions():
    result = {"forward_floor": 0.36, "load": 1.5, "rows": [{
        "selection": "last stage (conv5 + head)", "tensors": 42, "cut": "conv4_block6_out",
        "full_step_ms": 700.0, "uncached_ratio": 0.43, "predicted_uncached": 0.5,
        "cached_ratio": 0.19, "predicted_cached": 0.25}]}
    lines = report.resnet50_table(result).splitlines()
    assert lines[0].startswith("Forward floor without the cache 0.36 of a full step (700 ms)")
    assert lines[-1] == ("| last stage (conv5 + head) | 42 | conv4_block6_out | 0.43 (0.50) | "
                         "0.19 (0.25) |")


def test_the_fit_rows_are_set_against_plain_fit_and_said_in_a_sentence_in_the_readme():
    from elastictrainer.experiments import readme_tables

    plain = report.FIT_REFERENCE
    rows = [row(0, plain, None, 80.0, 1.0), row(1, plain, None, 82.0, 1.0),
            row(0, "ElasticCallback", 0.5, 78.0, 0.6), row(1, "ElasticCallback", 0.5, 80.0, 0.4),
            {"seed": 0, "run": "ElasticCallback", "rho": 0.3, "cache": "off", "error": "floor"},
            row(0, "ElasticCallback + cache (auto)", 0.3, 79.0, 0.3, step_ratio=0.2),
            row(1, "ElasticCallback + cache (auto)", 0.3, 81.6, 0.3, step_ratio=0.3)]
    means = report.means_table(rows, plain, report.FIT_AGAINST).splitlines()
    assert means[0].startswith("| run | rho | seeds | best accuracy | under plain fit's |")
    assert means[2] == f"| {plain} |  | 2 | 81.0% | 0.0 | 80.0% | 1.00 |  |"
    assert means[3] == "| ElasticCallback | 0.5 | 2 | 79.0% | 2.0 | 78.0% | 0.50 |  |"
    # 1.0 and 0.4 under
    assert means[5] == ("| ElasticCallback + cache (auto) | 0.3 | 2 | 80.3% | 0.7 | 79.3% | "
                        "0.30 | 0.25 |")
    assert readme_tables._fit_note(rows) == (
        "A pretrained Keras 3 CNN in `model.fit`, seeds 0-1: plain fit 81.0%; ElasticCallback at "
        "rho 0.5 uncached ends 2.0 under in 0.50 of its time, rho 0.3 uncached is refused "
        "(below the forward floor), rho 0.3 cached ends 0.7 under in 0.30 of its time")


def test_a_mean_that_rounds_to_zero_points_is_zero_not_minus_zero():
    from elastictrainer.experiments import readme_tables

    rows = [row(0, "full training", None, 80.0, 1.0), row(0, "ElasticTrainer", 0.5, 80.04, 0.5)]
    assert report.means_table(rows).splitlines()[3].startswith(
        "| ElasticTrainer | 0.5 | 1 | 80.0% | 0.0 |")
    assert readme_tables._points(-0.04) == "0.0 under"
    assert readme_tables._points(-0.06) == "0.1 over"


def test_an_unknown_part_is_one_line():
    import pytest

    from elastictrainer.errors import UserError

    with pytest.raises(UserError, match="unknown part 'nope'; valid: smallcnn, fit"):
        load_script("bench_prefix_cache").main(["--parts", "nope"])
