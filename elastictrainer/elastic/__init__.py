"""ElasticTrainer's runtime, the part the paper is about, in one place.

- runtime.py, the decisions (plain Python and NumPy, importable without TensorFlow): when to
  re-select, importance in and the exact selection under rho out (eq. 3), the closed loop that
  measures each selection's step ratio and corrects the time model (rho_control.py, its
  policy and refit; closed_loop.py, which runs it on each selection: solved, opened with its
  record, measured, corrected after a confirmed miss).
- economy.py, the runtime's Economy component, what a run may spend on re-selecting
  (--economy): a run too short to pay for a compile (the timing table's, else estimated from
  the model's size) is full training from its first step; later probes, measurements and
  switches keep the overhead within 10% of training and the run faster than full training;
  a selection left unmeasured still has its step ratio read out when that is cheap.
- prices.py, what the economy weighs, in seconds: a selection's compile (the table's, the
  model-size estimate, or the run's last), a refill of the prefix cache, a probe or full step,
  the overhead spent so far, and what the steps left save.
- accounting.py, where each second goes: the re-selection overhead and its parts, and the
  wall clock against full training's (wall_ratio).
- trend.py, whether a selection pays in training loss: one whose loss did not fall over an
  interval is replaced whatever the overhead budget says.
- judge.py, the runtime's Judge component, which asks trend.py and, with --pace_check, the
  pace check (pace.py, TensorFlow side) whether the current selection is failing.
- warmup.py, the head warm-up: a new classifier head trains alone before the first probes
  (--head_warmup), and for another round while those probes still choose it alone.
- state.py, its records, end result and state as typed objects (summary.json, checkpoints).
- driver.py, the TensorFlow side: runs the probe, full and selection steps the decisions ask
  for, times them, and reports back.  Every training loop (runs/loop.py, fit/callback.py, the
  benchmarks) drives the runtime through it.
- follower.py, a multi-worker run's other workers: they run what the chief's runtime decided.

`import elastictrainer.elastic` imports no TensorFlow; import elastic.driver for the driver.
"""
from elastictrainer.elastic.rho_control import RhoController, prefer_measured  # noqa: F401
from elastictrainer.elastic.accounting import wall_ratio  # noqa: F401
from elastictrainer.elastic.runtime import ElasticRuntime  # noqa: F401
from elastictrainer.elastic.state import (  # noqa: F401
    HEAD_WARMUP, OVERHEAD_PARTS, SHORT_RUN, STATE_VERSION, Correction, ElasticState, EndResult,
    Plan, SelectionRecord)
