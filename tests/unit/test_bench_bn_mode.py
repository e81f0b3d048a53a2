"""scripts/bench_bn_mode.py: its flags and its table from scripted results."""
from helpers import load_script


def _run(final, best, curve, cuts=(), served=None, ratio=None):
    return {"final": final, "best": best, "curve": curve, "train_s": 10.0, "ratio": ratio,
            "cuts": list(cuts), "served": served, "said": []}


def test_flags_and_the_table_it_writes():
    bench = load_script("bench_bn_mode")
    args = bench.build_parser().parse_args(["--configs", "user_resnet", "--seeds", "0,1",
                                            "--rhos", "0.3,0.5", "--epochs", "3"])
    assert args.seeds == (0, 1) and args.rhos == (0.3, 0.5) and args.epochs == 3
    rows = {("full training", "model"): [_run(70.0, 75.0, [60.0, 75.0, 70.0])] * 2,
            ("full training", "inference"): [_run(72.0, 76.0, [61.0, 76.0, 72.0]),
                                             _run(74.0, 76.0, [61.0, 76.0, 74.0])],
            ("ElasticTrainer rho 0.3, cached", "model"): [
                {"refused": "--rho 0.3 is below this model's forward floor: 0.45 (table)"}] * 2,
            ("ElasticTrainer rho 0.3, cached", "inference"): [
                _run(60.0, 66.0, [66.0, 60.0], cuts=["s1_out"], served=0.5, ratio=0.22)] * 2}
    text = bench.table(rows)
    lines = text.splitlines()
    assert lines[2] == ("| full training | model | 2 | 70.0% (70.0, 70.0) | 75.0% (75.0, 75.0) "
                        "| 10 s | - | off |")
    assert lines[3].startswith("| full training | inference | 2 | 73.0% (72.0, 74.0) |")
    assert lines[4] == ("| ElasticTrainer rho 0.3, cached | model | 2 | refused: --rho 0.3 is "
                        "below this model's forward floor: 0.45 | | | | |")
    assert lines[5].endswith("| 0.22 | at s1_out, 50% of steps served |")
    assert bench.same_curves(rows) == {"full training": False,
                                       "ElasticTrainer rho 0.3, cached": False}
    same = {k: v for k, v in rows.items() if k[0] == "full training" and k[1] == "model"}
    same[("full training", "inference")] = rows[("full training", "model")]
    assert bench.same_curves(same) == {"full training": True}
