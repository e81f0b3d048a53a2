"""A model.fit run's directory at the start of a fit (elastictrainer/fit/persist.py): a finished
run is refused, an unfinished one that never ended an epoch is started over."""
import json

import pytest

from elastictrainer.errors import UserError
from elastictrainer.fit import persist


def _leave(out, status):
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"status": status}))
    (out / "events.out.tfevents.1.host").write_text("")
    (out / persist.STATE_FILE).write_text("{}")
    (out / "config.json").write_text("{}")


def test_a_finished_run_is_refused_and_left_as_it_is(tmp_path):
    out = tmp_path / "run"
    _leave(out, "finished")
    with pytest.raises(UserError, match="already holds a finished run"):
        persist.refuse_finished(str(out))
    assert len(list(out.iterdir())) == 4


def test_an_unfinished_run_loses_its_events_and_state_and_says_so(tmp_path):
    out, said = tmp_path / "run", []
    _leave(out, "running")
    persist.refuse_finished(str(out))  # not finished: not refused
    persist.start_over(str(out), said.append)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "summary.json"]
    assert said == [f"ElasticCallback: starting {out} over: the fit that left it (running) "
                    f"ended before its first epoch did, so there is nothing to resume"]


def test_a_new_directory_is_left_alone(tmp_path):
    said = []
    persist.refuse_finished(str(tmp_path / "new"))
    persist.start_over(str(tmp_path / "new"), said.append)
    assert said == [] and not (tmp_path / "new").exists()
