"""elastic/driver.py's wiring, with a scripted trainer and the real decision part: what its
constructor is given is all it uses (announce, the runtime's is_compiled), and a prefix cache
that turns off mid-run is told to the runtime before that step is booked."""
import numpy as np

from elastictrainer.elastic import ElasticRuntime
from elastictrainer.method.time_model import TimeModel

from .test_prefix_time_model import CACHE, chain_table

N = 8


class Values:
    def __init__(self, values):
        self.values = np.asarray(values, float)

    def numpy(self):
        return self.values


class Cache:
    off = None


class Trainer:
    """What the driver drives (CompiledSteps's interface), no TensorFlow: every step takes
    1 ms; the cache turns off during the step of `off_at`."""

    in_step = True

    def __init__(self, off_at=None):
        self.prefix_cache = Cache()
        self.steps = {}
        self.step = 0
        self.off_at = off_at

    def _ran(self):
        if self.step == self.off_at:
            self.prefix_cache.off = "full disk"
        self.step += 1

    def probe_traced(self, want_terms=False):
        return True

    def probe_step(self, x, y, want_terms):
        self._ran()
        return Values([1.0]), Values([0.0]), Values(np.linspace(0.1, 1.0, N))

    def step_for(self, selection):
        def run(x, y):
            self._ran()
            return Values([1.0]), Values([0.0])
        return self.steps.setdefault(tuple(selection), run)


def run(trainer, steps, announce=None):
    from elastictrainer.elastic.driver import ElasticDriver

    now = [0.0]
    rt = ElasticRuntime(TimeModel(chain_table(), cache=CACHE), 0.5, steps_per_epoch=100,
                        total_steps=steps, interval=10, economy=False, clock=lambda: now[0],
                        is_compiled=lambda selection: selection in trainer.steps,
                        log=lambda line: None)
    driver = ElasticDriver(trainer, None, rt, announce=announce)
    driver.on_train_begin()
    cached_after = []
    for g in range(steps):
        step = driver.before_step(g)
        outputs = step(None, None)
        now[0] += 1e-3
        driver.after_step(g, 1e-3, outputs)
        cached_after.append(rt.ctl.model.cache is not None)
    return rt, driver, cached_after


def test_a_cache_that_turns_off_is_told_to_the_runtime_at_that_step():
    rt, _, cached_after = run(Trainer(off_at=5), 12)
    assert cached_after == [True] * 5 + [False] * 7
    rt, _, cached_after = run(Trainer(), 12)
    assert all(cached_after)


def test_announce_is_called_before_every_step_with_what_it_runs():
    said = []
    rt, driver, _ = run(Trainer(), 12, announce=lambda g, kind, sel: said.append((g, kind, sel)))
    assert [g for g, _, _ in said] == list(range(12))
    first = tuple(int(k) for k in np.flatnonzero(rt.records[0].mask))
    assert said[:3] == [(0, "probe", None), (1, "selection", first), (2, "full", first)]
    assert driver.selection == rt.selection == first


def test_the_selection_steps_losses_reach_the_runtime():
    """Each selection step's loss (its first output) is booked for the runtime's judgement of
    the selection (elastic/trend.py); probe and timed full steps' are not."""
    rt, driver, _ = run(Trainer(), 12)
    selection_steps = sum(r.steps for r in rt.records)
    assert selection_steps > 0
    losses = rt.state()["losses"]  # [loss sum, steps] buckets
    assert sum(n for _, n in losses) == sum(total for total, _ in losses) == selection_steps
