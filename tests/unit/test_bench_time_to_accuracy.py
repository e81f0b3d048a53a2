"""scripts/bench_time_to_accuracy.py: its flags and its table from scripted curves."""
from helpers import load_script

from elastictrainer.experiments import time_to_accuracy as tta


def test_flags_and_the_table_it_writes():
    bench = load_script("bench_time_to_accuracy")
    args = bench.build_parser().parse_args(["--configs", "command1", "--seeds", "0,1",
                                            "--rhos", "0.5", "--shares", "0.8,0.9"])
    assert args.shares == (0.8, 0.9) and args.rhos == (0.5,)
    curves = {"full_training": [[(10.0, 70.0), (20.0, 80.0)]] * 2,
              "ElasticTrainer rho auto, share 0.9": [[(5.0, 79.5), (9.0, 79.8)]] * 2,
              "ElasticTrainer rho 0.3": [tta.Refused("--rho 0.3 is below the floor")] * 2}
    results = {"date": "2026-11-26", "configs": {"command1": {
        "runs": 2, "schemes": tta.summarize(curves)}}}
    text = bench.markdown(results, args, {"cpu": "cpu", "cores": 2, "platform": "linux",
                                          "tensorflow": "2.21"})
    assert "--rhos 0.5 --shares 0.8,0.9" in text and "**command1** (2 seed(s))" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| Full training | 2 | 80.0% |")
    assert rows[2].startswith("| ElasticTrainer rho auto, share 0.9 | 2 | 79.8% | 0.2 | 5.0 s |")
    assert "refused: --rho 0.3 is below the floor" in rows[3]


def test_an_unknown_configuration_is_refused_before_any_run(tmp_path):
    import pytest

    from elastictrainer.errors import UserError

    bench = load_script("bench_time_to_accuracy")
    with pytest.raises(UserError, match="unknown configuration 'nope'; valid: command1"):
        bench.main(["--configs", "command1,nope", "--logdir", str(tmp_path / "logs"),
                    "--out", str(tmp_path / "tta")])
    assert not (tmp_path / "logs").exists() and not list(tmp_path.iterdir())
