"""Fixtures the tests share: profiled tables of tiny models (made once a session).  The
builders and other helpers are helpers.py's; they are re-exported here, so
`from conftest import tiny_model` works as `from helpers import tiny_model` does."""
from elastictrainer import tf_setup  # noqa: F401  (quiet TensorFlow first)

import pytest

from elastictrainer.profiler import run as prun
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
