"""Peak memory: profiling first can happen in another process, a traced step's graph is measured
for the compiled-step cache's byte bound (unit/test_memory.py), and the importance probe frees
as it goes."""
import os

import numpy as np
import pytest

from helpers import batch, snapshot, tiny_model
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.method import importance
from elastictrainer.method import schemes
from elastictrainer.errors import UserError
from elastictrainer.profiler import child as pchild, run as prun
from elastictrainer.method.roles import tensor_roles
from elastictrainer.train.compiled import CompiledSteps, graph_bytes


# ------------------------------------------------------------------ a traced step's size
def test_graph_bytes_measures_a_traced_train_step():
    model = tiny_model()
    opt = optimizers.make_optimizer("sgd", 0.01, 0.0, 10)
    optimizers.prepare_optimizer(opt, model.trainable_weights)
    step = train_steps.make_train_step(model, opt, train_steps.make_loss(), model.trainable_weights[-2:])
    assert graph_bytes(step) is None  # not traced yet
    step(*batch())
    first = graph_bytes(step)
    full = train_steps.make_train_step(model, opt, train_steps.make_loss(), model.trainable_weights)
    full(*batch())
    assert 0 < first < graph_bytes(full)  # the full backward pass is a bigger graph


# ------------------------------------------------------------------ profiling in a child
def test_profiling_first_runs_in_another_process(tmp_path, monkeypatch):
    """The training process never builds the profiler's graphs: profile_model is not called
    in it, and the table says another process wrote it."""
    from elastictrainer.models.build import build_sized

    model, _, _ = build_sized("smallcnn", 32, 10, "none")

    def refuse(*a, **k):
        raise AssertionError("profile_model ran in the training process")

    monkeypatch.setattr(prun, "profile_model", refuse)
    path = str(tmp_path / "t.json")
    logged = []
    table = prun.load_or_profile(path, model, "smallcnn", 32, 4, 10, progress=False,
                                 log=logged.append)
    assert os.path.exists(path) and "profiling this configuration first" in logged[0]
    assert table["profiled_pid"] != os.getpid()
    assert [t["name"] for t in table["tensors"]] == [v.name for v in model.trainable_weights]
    assert table["peak_rss_mb"] > 0
    # where the child's time went, its start and model build included, comes back with it
    phases = table["profiling_phases_s"]
    assert {"child_start", "build_model", "trace_compile", "traced_steps", "write_table",
            "child_exit"} <= set(phases) and all(s >= 0 for s in phases.values())
    assert any(m.startswith("profiled in a child process in ") for m in logged)


def test_a_run_profiles_in_its_own_process_unless_it_asks_for_a_child():
    import dataclasses

    from elastictrainer import Config
    from elastictrainer.runs.setup import profiles_in_child

    here, child = Config(), dataclasses.replace(Config(), profile_in="child")
    assert not profiles_in_child(here, given_model=False, distributed=False)
    assert profiles_in_child(child, given_model=False, distributed=False)
    assert profiles_in_child(here, given_model=False, distributed=True)  # a strategy's model
    assert not profiles_in_child(child, given_model=True, distributed=False)  # not rebuildable


def test_an_error_in_the_profiling_process_is_one_user_error_line(tmp_path):
    missing = str(tmp_path / "nowhere.keras")
    with pytest.raises(UserError) as e:
        pchild.profile_in_child(str(tmp_path / "t.json"), missing, 16, 4, 10, progress=False)
    message = str(e.value)
    assert "\n" not in message and "model file not found" in message and missing in message
    assert not os.path.exists(tmp_path / "t.json")


def test_in_process_profiling_is_still_available(tmp_path):
    model = tiny_model()
    table = prun.load_or_profile(str(tmp_path / "t.json"), model, "tiny", 16, 4, 10,
                                 progress=False, log=lambda m: None, in_child=False)
    assert table["profiled_pid"] == os.getpid()


# ------------------------------------------------------------------ the importance probe
def test_probe_restores_weights_and_optimizer_state_bit_for_bit():
    model = tiny_model()
    scheme = schemes.SCHEMES["elastic_training"]
    opt = optimizers.make_optimizer("sgd", 0.05, 5e-4, 100)
    tr = CompiledSteps(model, opt, scheme, tensor_roles(model))
    tr.step_for((0, 1))(*batch(seed=3))  # momentum slots and iterations not at zero
    w0, s0 = snapshot(tr.variables), snapshot(opt.variables)
    imp = importance.taylor_importance(tr, [batch(seed=5)])
    assert imp.shape == (len(tr.variables),) and np.all(np.isfinite(imp)) and np.any(imp != 0)
    for a, b in zip(w0 + s0, snapshot(tr.variables) + snapshot(opt.variables)):
        np.testing.assert_array_equal(a, b)
