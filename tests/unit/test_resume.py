"""Whether a run directory is resumed (runs/setup.py's _resumable), from its files alone: an
unfinished run of the same settings is; other settings and a finished run are refused in one
line; --resume false starts it over, its checkpoints and TensorBoard events removed."""
import dataclasses

import pytest

from elastictrainer import config, runlog
from elastictrainer.errors import UserError
from elastictrainer.runs.checkpoint import CHECKPOINT_DIR
from elastictrainer.runs.setup import _resumable


def cfg(**kw):
    base = dict(model_name="smallcnn", dataset_name="synthetic", input_size=16, batch_size=8,
                rho=0.7, run_name="r")
    return config.Config(**{**base, **kw})


def left(tmp_path, status):
    """A run directory as a run of cfg() leaves it (its checkpoint index, config.json,
    summary.json with `status`, an events file)."""
    out = tmp_path / "r"
    (out / CHECKPOINT_DIR).mkdir(parents=True)
    (out / CHECKPOINT_DIR / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    runlog.write_json(str(out / runlog.CONFIG_FILE), dataclasses.asdict(cfg()))
    runlog.write_json(str(out / runlog.SUMMARY_FILE), {"status": status, "epochs": [{}]})
    (out / "events.out.tfevents.1.host").write_bytes(b"")
    return out


def test_an_unfinished_run_of_the_same_settings_is_resumed(tmp_path):
    assert _resumable(str(left(tmp_path, "running")), cfg(), print) is True
    assert _resumable(str(tmp_path / "new"), cfg(), print) is False  # nothing to resume


@pytest.mark.parametrize("status,settings,says", [
    ("running", {"rho": 0.8}, "holds a run with --rho 0.7, not 0.8: pass another --run_name, "
                              "or --resume false to start that run over"),
    ("finished", {}, "already holds a finished run; pass another --run_name, or --resume false "
                     "to start it over"),
])
def test_other_settings_or_a_finished_run_are_refused_in_one_line(tmp_path, status, settings,
                                                                   says):
    out = left(tmp_path, status)
    with pytest.raises(UserError) as e:
        _resumable(str(out), cfg(**settings), print)
    assert str(e.value) == f"{out} {says}"


def test_resume_false_starts_the_run_over(tmp_path):
    out = left(tmp_path, "running")
    said = []
    assert _resumable(str(out), cfg(resume=False), said.append) is False
    assert said == [f"--resume false: starting {out} over (its checkpoints are replaced)"]
    assert sorted(p.name for p in out.iterdir()) == [runlog.CONFIG_FILE, runlog.SUMMARY_FILE]
