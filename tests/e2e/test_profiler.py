"""profiler.py end to end: a user's model file profiled in a subprocess, its table in the
declared format, its figure and its trace kept."""
import json
import os

from elastictrainer.profiler import table_format as pformat
from helpers import run_profiler_cli as _run, tiny_cnn


def test_cli_profiles_a_user_model_file(tmp_path):
    path = str(tmp_path / "mine.keras")
    tiny_cnn(num_classes=3).save(path)
    out = str(tmp_path / "table.json")
    r = _run(["--model_name", path, "--batch_size", "2", "--num_iterations", "2", "--output", out,
              "--figure", str(tmp_path / "fig.png"), "--quiet"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    table = json.load(open(out))
    # the file's own input size (the flag's 224 is said not to apply) and classes
    assert table["input_size"] == 24 and table["num_classes"] == 3
    assert "mine.keras takes 24x24 images: profiled at 24, not --input_size 224" in r.stdout
    for key in pformat.REQUIRED_KEYS:
        assert key in table
    # the file the profiler wrote is exactly what the declared format reads and writes back
    assert pformat.TimingTable.from_dict(table, out).to_dict() == table
    assert os.path.exists(tmp_path / "fig.png")
    # the real trace is kept where TensorBoard's Profile tab looks, beside the runs in logs/
    kept = list((tmp_path / "logs" / "table_profile" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(kept) == 1 and table["trace"] == os.path.relpath(kept[0], tmp_path)
