"""train/distribution.py's checks that need no TensorFlow: TF_CONFIG as TensorFlow documents it, and
the flags that go together."""
import json

import pytest

from elastictrainer.errors import UserError
from elastictrainer.config import Config
from elastictrainer.train.distribution import parse_tf_config

GOOD = {"cluster": {"worker": ["localhost:1234", "localhost:1235"]},
        "task": {"type": "worker", "index": 1}}


def test_a_documented_tf_config_is_read():
    cluster, task = parse_tf_config(json.dumps(GOOD))
    assert cluster["worker"] == ["localhost:1234", "localhost:1235"] and task["index"] == 1


@pytest.mark.parametrize("text,says", [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"task": GOOD["task"]}), "no 'cluster'"),
    (json.dumps({"cluster": {"worker": "localhost:1"}, "task": GOOD["task"]}), "host:port"),
    (json.dumps({"cluster": {"worker": ["localhost"]}, "task": GOOD["task"]}), "host:port"),
    (json.dumps({"cluster": {"ps": ["a:1"]}, "task": GOOD["task"]}), "no 'worker'"),
    (json.dumps({"cluster": GOOD["cluster"]}), "no 'task'"),
    (json.dumps({"cluster": GOOD["cluster"], "task": {"type": "chief", "index": 0}}),
     "not a job"),
    (json.dumps({"cluster": GOOD["cluster"], "task": {"type": "worker", "index": 2}}),
     "outside its worker job"),
])
def test_a_malformed_tf_config_is_one_line_saying_what_is_wrong(text, says):
    with pytest.raises(UserError, match=says) as e:
        parse_tf_config(text)
    assert "\n" not in str(e.value)


def test_flags_that_do_not_go_together_are_refused(monkeypatch):
    with pytest.raises(UserError, match="mirrored only"):
        Config(logical_cpus=2).validate()
    with pytest.raises(UserError, match="at least 2"):
        Config(strategy="mirrored", logical_cpus=1).validate()
    with pytest.raises(UserError, match="unknown --strategy"):
        Config(strategy="ring").validate()
    monkeypatch.setenv("TF_CONFIG", "{oops")
    with pytest.raises(UserError, match="TF_CONFIG is not JSON"):
        Config(strategy="multi_worker").validate()
    Config(strategy="mirrored", logical_cpus=2).validate()
