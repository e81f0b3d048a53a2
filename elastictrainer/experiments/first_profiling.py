"""What a run's first profiling costs, for the benchmarks that add it to an elastic run's time
(scripts/bench_time_to_accuracy.py): profiler.py's work on a configuration's model, measured
once and kept beside the runs (profile_seconds.json) so that a later invocation reads it back.

It is timed after a warm-up, a few full training steps of the same model on random batches
(warm_up), as every run it is added to is timed after one: the process's first traces are
not the profiling's to pay.  A record from before this rule (no "warm" in it) is measured
again."""
import json
import os
import time

from elastictrainer import runlog

# Full training steps before the first profiling is timed
WARM_UP_STEPS = 5
RECORD = "profile_seconds.json"  # under the configuration's --logdir


def seconds(cfg, log, warm=None):
    """Seconds profiling `cfg`'s model takes where a run of `cfg` profiles first
    (--profile_in), read from `cfg.logdir`'s record when one was measured warm.  warm(cfg):
    the process's warm-up (warm_up, below, unless given)."""
    from elastictrainer.models.build import build_sized
    from elastictrainer.profiler import table as tables
    from elastictrainer.profiler.run import load_or_profile

    record = os.path.join(cfg.logdir, RECORD)
    if os.path.exists(record):
        with open(record) as f:
            kept = json.load(f)
        if kept.get("warm"):
            return kept["seconds"]
    (warm or warm_up)(cfg)
    model, size, classes = build_sized(cfg.model_name, cfg.input_size, 10, cfg.weights,
                                       log=lambda m: None, progress=False)
    path = tables.default_table_path(cfg.model_name, size, cfg.batch_size, classes,
                                     cfg.optimizer)
    if os.path.exists(path):
        os.replace(path, path + ".before_bench")  # profiled again, and timed
    t0 = time.perf_counter()
    # on the model the run has built, as the run would
    load_or_profile(path, model, cfg.model_name, size, cfg.batch_size, classes, seed=cfg.seed,
                    progress=False, log=lambda m: None, optimizer=cfg.optimizer,
                    in_child=cfg.profile_in == "child")
    took = time.perf_counter() - t0
    os.makedirs(cfg.logdir, exist_ok=True)
    runlog.write_json(record, {"seconds": took, "table": path, "warm": True})
    log(f"profiling {cfg.model_name}: {took:.1f} s")
    return took


def warm_up(cfg, steps=WARM_UP_STEPS):
    """A few full training steps of a model of `cfg`'s on random batches of its shapes:
    TensorFlow's first traces in this process (the keras3_fit configuration's warm-up fit)."""
    import numpy as np
    import tensorflow as tf

    from elastictrainer import flavors
    from elastictrainer.flavors import optimizers
    from elastictrainer.models.build import build_sized
    from elastictrainer.train import steps as train_steps

    model, size, classes = build_sized(cfg.model_name, cfg.input_size, 10, cfg.weights,
                                       log=lambda m: None, progress=False)
    opt = optimizers.make_optimizer(cfg.optimizer, cfg.learning_rate, 0.0, total_steps=steps,
                                    flavor=flavors.for_model(model).NAME)
    optimizers.prepare_optimizer(opt, model.trainable_weights)
    step = train_steps.make_train_step(model, opt, train_steps.make_loss(),
                                       model.trainable_weights)
    rng = np.random.default_rng(cfg.seed)
    x = tf.constant(rng.uniform(0, 255, (cfg.batch_size, size, size, 3)), tf.float32)
    y = tf.constant(rng.integers(0, classes, cfg.batch_size), tf.int32)
    for _ in range(steps):
        step(x, y)[0].numpy()
