"""Peak memory: the compiled-step cache keeps the current step, and is bounded in bytes as
well as in count where it keeps more (with stand-in steps of known sizes)."""
from elastictrainer.train.compiled import StepCache


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
    cache, _ = _cache({"step1": 10, "step2": 500}, maxsize=8, max_bytes=100)
    cache(1)
    assert cache(2) == "step2"
    assert list(cache._steps) == [2]  # the big one stays: it is the step about to run


def test_step_cache_counts_a_step_once_its_size_is_known():
    sizes = {}
    cache, _ = _cache(sizes, maxsize=8, max_bytes=100)
    cache(1), cache(2), cache(3)  # not traced yet: size unknown, nothing evicted
    assert len(cache) == 3 and cache.nbytes == 0
    sizes.update(step1=60, step2=60, step3=60)
    cache(3)  # now measured: 180 > 100, the two least recently used go
    assert list(cache._steps) == [3] and cache.evictions == 2


def test_step_cache_count_bound_still_holds_without_a_byte_budget():
    cache, _ = _cache({}, maxsize=8)
    for k in range(10):
        cache(k)
    assert len(cache) == 8 and 0 not in cache and 9 in cache


def test_a_run_keeps_the_current_step_only_and_releases_the_dropped_ones():
    """STEPS_KEPT: an elastic run holds its probe step and one selection's (more would raise
    its peak above full training's), and every dropped step's memory is released."""
    from elastictrainer.train.compiled import STEPS_KEPT
    released = []
    cache, made = _cache({}, on_evict=lambda: released.append(len(cache)))
    assert STEPS_KEPT == 1
    for k in (1, 2, 1):
        cache(k)
    assert list(cache._steps) == [1] and made == [1, 2, 1]
    assert released == [1, 1]  # after each of the two evictions, one step left
