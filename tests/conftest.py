"""Fixtures the tests share: profiled tables of tiny models (made once a session), and TFDS
without its network check.  The builders and other helpers are helpers.py's; they are
re-exported here, so `from conftest import tiny_model` works as `from helpers import
tiny_model` does.

The tests are in three levels, each a folder: unit/ (no TensorFlow graph traced, no model
trained; `pytest tests/unit -q` takes about 30 s), integration/ (tiny models built,
trained and profiled in-process, input pipelines read, checkpoints restored) and e2e/ (the
README's example, the command-line programs as subprocesses, the smoke figure, a run killed
and resumed).  `pytest -q` from the repository's root runs all three."""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import pytest

from elastictrainer.data import tfds_data
from elastictrainer.method import schemes
from elastictrainer.prefix import plan as prefix_plan
from elastictrainer.profiler import reuse, run as prun
from helpers import (  # noqa: F401  (re-exported)
    ROOT, batch, load_script, snapshot, tiny_attention, tiny_cnn, tiny_mlp, tiny_model,
    write_image_folder,
)


@pytest.fixture(scope="session")
def cnn_table():
    model = tiny_cnn()
    return model, prun.profile_model(model, "tiny_cnn", 24, 4, 5, num_iterations=3, progress=False)


@pytest.fixture(scope="session")
def attn_table():
    model = tiny_attention()
    return model, prun.profile_model(model, "tiny_attn", 16, 4, 5, num_iterations=3, progress=False)


@pytest.fixture(autouse=True)
def disk_with_room(monkeypatch):
    """The prefix cache plans its disk store against the free space less a reserve of 5% of
    the disk (prefix/store.py), read once by plan() and handed to the cache: scripted here as
    1 GB, so that a machine with little free disk does not turn the tests' caches off.  A test
    of another amount scripts its own."""
    monkeypatch.setattr(prefix_plan, "free_disk_bytes", lambda path: 2**30)


@pytest.fixture(autouse=True)
def built_in_schemes_only():
    """The scheme registry as the package builds it, restored after each test: a scheme a test
    registers (a benchmark's hand-frozen fixed_from_<k>) would otherwise stay in --train_type's
    help, and so in the documented flag table, for every later test of the process."""
    saved = dict(schemes.SCHEMES)
    yield
    schemes.SCHEMES.clear()
    schemes.SCHEMES.update(saved)


@pytest.fixture(autouse=True)
def no_table_kept_from_another_test():
    """Each test profiles as if it were the process's first run (profiler/reuse.py)."""
    reuse.forget()


@pytest.fixture
def no_network_check(monkeypatch):
    """mock_data turns download_and_prepare into a no-op; skip the reachability probe before it."""
    monkeypatch.setattr(tfds_data, "_download_blocker", lambda builder, **kw: None)
