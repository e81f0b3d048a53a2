"""train/distribution.py's checks that need no TensorFlow device: TF_CONFIG as TensorFlow
documents it, the flags that go together, and a strategy without its devices or its cluster
(the one check that needs a strategy made, a batch that does not divide among its replicas, is
tests/e2e/test_distribute.py's)."""
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


def test_a_strategy_without_its_devices_or_its_cluster_is_refused_in_one_line(monkeypatch):
    import tensorflow as tf

    from elastictrainer.train import distribution

    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])  # no GPU
    with pytest.raises(UserError) as e:
        distribution.configure(Config(strategy="mirrored"))
    assert str(e.value) == ("--strategy mirrored found 0 GPU(s): it needs two devices or more; "
                            "pass --logical_cpus N to split the CPU into N")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(UserError) as e:
        distribution.configure(Config(strategy="multi_worker"))
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("--strategy multi_worker needs the cluster: set TF_CONFIG")
