"""scripts/bench_keras.py on its small cell: both Kerases profiled and trained, the table
written with the machine and date."""
import json

from helpers import load_script


def test_the_keras_comparison_writes_both_kerases_rows(tmp_path):
    script = load_script("bench_keras")
    out = str(tmp_path / "bench_keras")
    assert script.main(["--cells", "cnn64", "--steps", "9", "--repeats", "1", "--out", out]) == 0
    results = json.load(open(out + ".json"))
    cell = results["cells"]["cnn64"]
    for flavor in ("tf_keras", "keras3"):
        profile = cell[flavor]["profile"]
        assert profile["tensors"] == 14 and profile["unattributed_ops"] == 0
        assert profile["full_step_ms"] > 0 and 0 < profile["forward_share"] < 1
        assert len(cell[flavor]["runs"]) == len(cell[flavor]["fit_runs"]) == 1
    text = open(out + ".md").read()
    assert text.startswith("Machine: ") and "| cnn 64 px, batch 32 | Keras 3 | 14 |" in text
