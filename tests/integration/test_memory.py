"""Peak memory: profiling first happens in another process, the compiled-step cache
is bounded in bytes as well as in count, and the importance probe frees as it goes."""
import os

import numpy as np
import pytest

from helpers import batch, snapshot, tiny_model
from elastictrainer import engine, importance, schemes
from elastictrainer.common import UserError
from elastictrainer.profiler import run as prun
from elastictrainer.roles import tensor_roles
from elastictrainer.trainer import StepCache, Trainer, graph_bytes


# ------------------------------------------------------------------ StepCache byte budget
def _cache(sizes, **kw):
    made = []

    def factory(key):
        made.append(key)
        return f"step{key}"

    cache = StepCache(factory, size_fn=lambda step: sizes.get(step), **kw)
    return cache, made


def test_step_cache_evicts_least_recently_used_beyond_a_byte_budget():
    sizes = {"step1": 40, "step2": 40, "step3": 40}
    cache, made = _cache(sizes, maxsize=8, max_bytes=100)
    cache(1), cache(2)
    assert len(cache) == 2 and cache.nbytes == 80
    cache(1)  # 1 is now the most recently used
    cache(3)  # 120 bytes > 100: the least recently used (2) goes
    assert 2 not in cache and 1 in cache and 3 in cache
    assert cache.nbytes == 80 and cache.evictions == 1
    cache(2)  # traced again
    assert made == [1, 2, 3, 2] and cache.traces == 4


def test_step_cache_keeps_the_step_it_returns_even_over_budget():
    cache, _ = _cache({"step1": 10, "step2": 500}, max_bytes=100)
    cache(1)
    assert cache(2) == "step2"
    assert list(cache._steps) == [2]  # the big one stays: it is the step about to run


def test_step_cache_counts_a_step_once_its_size_is_known():
    sizes = {}
    cache, _ = _cache(sizes, max_bytes=100)
    cache(1), cache(2), cache(3)  # not traced yet: size unknown, nothing evicted
    assert len(cache) == 3 and cache.nbytes == 0
    sizes.update(step1=60, step2=60, step3=60)
    cache(3)  # now measured: 180 > 100, the two least recently used go
    assert list(cache._steps) == [3] and cache.evictions == 2


def test_step_cache_count_bound_still_holds_without_a_byte_budget():
    cache, _ = _cache({})
    for k in range(10):
        cache(k)
    assert len(cache) == 8 and 0 not in cache and 9 in cache


def test_graph_bytes_measures_a_traced_train_step():
    model = tiny_model()
    opt = engine.make_optimizer("sgd", 0.01, 0.0, 10)
    engine.prepare_optimizer(opt, model.trainable_weights)
    step = engine.make_train_step(model, opt, engine.make_loss(), model.trainable_weights[-2:])
    assert graph_bytes(step) is None  # not traced yet
    step(*batch())
    first = graph_bytes(step)
    full = engine.make_train_step(model, opt, engine.make_loss(), model.trainable_weights)
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


def test_an_error_in_the_profiling_process_is_one_user_error_line(tmp_path):
    missing = str(tmp_path / "nowhere.keras")
    with pytest.raises(UserError) as e:
        prun.profile_in_child(str(tmp_path / "t.json"), missing, 16, 4, 10, progress=False)
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
    opt = engine.make_optimizer("sgd", 0.05, 5e-4, 100)
    tr = Trainer(model, opt, scheme, tensor_roles(model))
    tr.step_for((0, 1))(*batch(seed=3))  # momentum slots and iterations not at zero
    w0, s0 = snapshot(tr.variables), snapshot(opt.variables)
    imp = importance.taylor_importance(tr, [batch(seed=5)])
    assert imp.shape == (len(tr.variables),) and np.all(np.isfinite(imp)) and np.any(imp != 0)
    for a, b in zip(w0 + s0, snapshot(tr.variables) + snapshot(opt.variables)):
        np.testing.assert_array_equal(a, b)
