"""scripts/bench_cache_views.py: each cached run is read against the uncached run of its seed,
and a configuration it does not know gets one line and exit 2."""
import pytest

from elastictrainer import errors
from helpers import load_script


def test_rows_are_read_against_the_uncached_run_of_the_same_seed():
    script = load_script("bench_cache_views")
    runs = {"0/0": {"best": 60.0, "train_s": 100.0}, "0/1": {"best": 58.0, "train_s": 120.0},
            "2/0": {"best": 53.0, "train_s": 80.0}, "2/1": {"best": 57.0, "train_s": 90.0}}
    text = script.table(runs, [0, 2], [0, 1])
    assert "| uncached (fresh views) | 60.0% (+0.0) | 58.0% (+0.0) | +0.0 | 1.00 |" in text
    # seed 0: 7.0 under in 0.80 of the time; seed 1: 1.0 under in 0.75
    assert "| 2 views cached | 53.0% (+7.0) | 57.0% (+1.0) | +4.0 | 0.78 |" in text


def test_an_unknown_configuration_is_one_line_and_exit_2(capsys):
    script = load_script("bench_cache_views")
    with pytest.raises(SystemExit) as e:
        errors.run_cli(script.main, ["--configs", "cifar"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and "efficientnet_imagenet" in err[0]
