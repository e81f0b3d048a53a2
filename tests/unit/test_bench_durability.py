"""scripts/bench_durability.py: the shares it reports are each part's seconds over the training
time, summed; its flags parse with the paper regime's defaults."""
from helpers import load_script


def _script():
    return load_script("bench_durability")


def test_each_part_is_a_share_of_the_training_time_and_they_add_up():
    out = _script().shares({"fsync": 0.5, "cache": 1.5}, 100.0)
    assert out["parts"] == {"fsync": {"s": 0.5, "share": 0.005},
                            "cache": {"s": 1.5, "share": 0.015}}
    assert out["total_s"] == 2.0 and out["total_share"] == 0.02


def test_its_defaults_are_the_paper_regime():
    args = _script().build_parser().parse_args([])
    assert (args.model_name, args.input_size, args.batch_size, args.num_train) == \
        ("mobilenetv2", 96, 8, 2000)
