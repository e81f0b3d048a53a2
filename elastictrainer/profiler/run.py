"""The profiler's driver (paper Sec. 5): profile a model's training step, write its table.

We trace the very training step that training runs (train_steps.make_train_step, with the run's
optimizer, whose update ops differ: SGD with momentum and weight decay, or Adam), attribute every
traced op to the trainable tensors by dataflow, and calibrate the time model on a few timed
partial selections; assemble.py turns what was measured into the table.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from elastictrainer import flavors
from elastictrainer.train import steps as train_steps
from elastictrainer.flavors import optimizers
from elastictrainer.errors import UserError, one_line
from elastictrainer.machine import release_memory
from elastictrainer.profiler import attribution, calibration, report, reuse, table as tables
from elastictrainer.profiler import assemble, child, trace
from elastictrainer.profiler.phases import Phases, phases_text
from elastictrainer.profiler.dataflow import GraphInfo

# Warm-up and profiled steps of a run's first profiling (load_or_profile; profiler.py's own
# settings are ProfileConfig's)
FIRST_WARMUP, FIRST_ITERATIONS = 2, 5


def profile_model(model, model_name, input_size, batch_size, num_classes, num_iterations=5,
                  warmup=2, trace_dir=None, seed=0, progress=True, calibrate=True,
                  optimizer="sgd", clock=time.perf_counter, batch=None, loss_fn=None,
                  min_rounds=calibration.MIN_ROUNDS, run_steps=None):
    """Profile full training steps of `model` and return the timing table (a JSON-able dict).

    Runs `warmup` steps, then times forward-only and full training steps interleaved
    (median wall time: t_fp, t_full; t_bp = t_full - t_fp, measured, not the 2 x forward rule),
    then traces `num_iterations` full steps under tf.profiler and attributes their ops.
    With `calibrate`, a few reference selections are then timed for real to fit separate
    t_dw / t_dy scales (calibration.fit_calibration).  `optimizer` is the training run's
    (optimizers.OPTIMIZERS), or an optimizer object whose kind is profiled (a fresh one of its
    class and configuration; the table names it by its class): its update ops are part of
    every tensor's t_dw.  The model's weights are restored afterwards.  `clock`: seconds, read
    around every timed step (a test's fake clock decides what the timings say).  `batch`: an
    (x, y) batch to time on instead of random images of input_size (model.fit's, for one);
    `loss_fn(y, y_pred)`: the loss instead of sparse categorical cross-entropy on logits.
    The timed steps and the calibration's rounds stop after `min_rounds` of their
    `num_iterations` once their times agree (calibration.settled); the traced steps are always
    `num_iterations`.  `run_steps`: the steps of the run this first profiling is for; it then
    calibrates only when that is worth it for so many steps (calibration.worth_calibrating),
    and otherwise records why not (calibration_skipped) and the probe step's compile as
    compile_ms.  None (profiler.py): `calibrate` alone decides.
    """
    from tqdm import tqdm

    if num_iterations < 1:
        raise UserError("--num_iterations must be at least 1")
    wall0 = clock()
    phases = Phases(clock)
    variables = list(model.trainable_weights)
    if not variables:
        raise UserError("the model has no trainable weights to profile")
    saved = model.get_weights()
    # The learning rate's value does not change the ops a step runs, only the optimizer does.
    if isinstance(optimizer, str):
        opt = optimizers.make_optimizer(optimizer, 1e-4, 5e-4, total_steps=1000,
                                    flavor=flavors.for_model(model).NAME)
    else:  # its kind, fresh: profiling must not move the run's own optimizer state
        opt = type(optimizer).from_config(optimizer.get_config())
        if hasattr(optimizer, "per_tensor_bias_correction"):
            opt.per_tensor_bias_correction = optimizer.per_tensor_bias_correction
        optimizer = type(optimizer).__name__.lower()
    optimizers.prepare_optimizer(opt, variables)
    loss_fn = loss_fn or train_steps.make_loss()
    capture = {}
    step = train_steps.make_train_step(model, opt, loss_fn, variables, capture=capture)
    forward = train_steps.make_forward_step(model, loss_fn)
    # A run times its full steps on its probe function (train_steps.make_probe_step: no update) and
    # scales them by t_full / t_grads; timing t_grads on that same function keeps the scale exact.
    probe = train_steps.make_probe_step(model, opt, loss_fn, variables)

    def gradients(x, y):
        return probe(x, y, want_terms=False)

    if batch is None:
        rng = np.random.default_rng(seed)
        x = tf.constant(rng.uniform(0, 255, (batch_size, input_size, input_size, 3)),
                        tf.float32)
        y = tf.constant(rng.integers(0, num_classes, batch_size), tf.int32)
    else:
        x, y = batch

    n_refs = len(calibration.reference_selections(np.arange(len(variables)))) if calibrate else 0
    bar = tqdm(total=warmup + 3 * num_iterations + (n_refs + num_iterations if n_refs else 0),
               desc="profiling", disable=not progress, unit="step")
    phases.mark("setup")
    for k in range(warmup):
        step(x, y)[0].numpy()
        forward(x, y)[0].numpy()
        t0 = clock()
        train_steps.first_output(gradients(x, y)).numpy()
        if k == 0:
            # traces and compiles the probe step: compiled after the other two, as a run's
            # selection steps are, it took what a reference selection's compile takes (Keras'
            # MobileNetV2 6.9 s against 5.7-9.4 s; the full step's first call, 14.4 s, also
            # builds what every later trace reuses)
            probe_first_s = clock() - t0
        bar.update(1)
        # the first round traces and compiles the three steps; the rest is warm-up proper
        phases.mark("trace_compile" if k == 0 else "warmup")
    graph = step.get_concrete_function(x, y).graph
    info = GraphInfo(graph, capture["loss"], capture["grads"], variables, opt.variables)
    phases.mark("dataflow")

    fp, full, grads = [], [], []
    for _ in range(num_iterations):
        t0 = clock()
        forward(x, y)[0].numpy()
        fp.append(clock() - t0)
        bar.update(1)
        t0 = clock()
        step(x, y)[0].numpy()
        full.append(clock() - t0)
        t0 = clock()
        train_steps.first_output(gradients(x, y)).numpy()
        grads.append(clock() - t0)
        bar.update(1)
        if calibration.settled((fp, full, grads), min_rounds):
            break
    phases.mark("timed_steps")
    skipped = probe_compile_ms = None
    if n_refs and run_steps is not None and warmup > 0:
        t_full_s = statistics.median(full)
        compile_s = max(probe_first_s - statistics.median(grads), 0.0)
        estimate = calibration.calibration_estimate_s(compile_s, t_full_s, n_refs)
        if not calibration.worth_calibrating(estimate, t_full_s, run_steps):
            skipped = (f"calibrating (its {n_refs} reference selections' steps compiled and "
                       f"timed, about {estimate:.0f} s) would take more than "
                       f"{calibration.CALIBRATION_SHARE:.0%} of what the run's {run_steps} steps "
                       f"take at the full step's pace ({run_steps * t_full_s:.0f} s)")
            probe_compile_ms = compile_s * 1e3
            bar.total -= n_refs + num_iterations
            n_refs = 0

    own_dir = trace_dir is None
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="et_trace_")
    tf.profiler.experimental.start(trace_dir)
    try:
        for _ in range(num_iterations):
            step(x, y)[0].numpy()
            bar.update(1)
    finally:
        tf.profiler.experimental.stop()
    phases.mark("traced_steps")
    xplane = trace.find_xplane(trace_dir)
    op_times, kernel_type = trace.read_op_times(xplane)
    if own_dir:
        shutil.rmtree(trace_dir, ignore_errors=True)
    phases.mark("parse_trace")
    att = attribution.attribute(info, op_times, kernel_type, num_iterations)
    fp_layers = attribution.forward_by_layer(
        info, op_times, num_iterations, _leaf_layer_names(model),
        suffixed=flavors.for_model(model).NAME == "keras3")
    phases.mark("attribution")
    references, compile_ms = {}, probe_compile_ms
    if n_refs:
        references, compile_ms = calibration.time_reference_selections(
            model, opt, loss_fn, variables, step, info.rank, x, y, num_iterations, bar, clock,
            min_rounds)
        phases.mark("calibration")
    bar.close()
    model.set_weights(saved)
    phases.mark("restore")

    return assemble.timing_table(
        model_name, input_size, batch_size, num_classes, optimizer, variables, info, att,
        fp_layers, (fp, full, grads), num_iterations, compile_ms, references, skipped,
        trace=None if own_dir else xplane, phases=phases.seconds, clock=clock, started=wall0)


def _leaf_layer_names(model):
    """Names of the layers a model's call runs, nested models' layers included (not the
    nested models themselves: their scopes hold their layers' scopes)."""
    names = []
    for layer in model.layers:
        inner = getattr(layer, "layers", None)
        names += _leaf_layer_names(layer) if inner else [layer.name]
    return names


def load_or_profile(path, model, model_name, input_size, batch_size, num_classes, seed=0,
                    progress=True, log=print, optimizer="sgd", in_child=True, trace_dir=None,
                    run_steps=None):
    """The table at `path` for `model`; when there is none, the table this process profiled
    for the same model and shapes (profiler/reuse.py, written at `path`), else profiling first.

    With `in_child` (the default) the profiling runs in a separate Python process
    (child.profile_in_child) that rebuilds the model from `model_name`: its graphs, trace and
    allocator high-water mark die with it, so profiling first does not raise the training
    process's peak memory.  `in_child=False` profiles `model` itself in this process (for a
    model that cannot be rebuilt from its name) and then releases what it can (release_memory).
    trace_dir: where the profiling keeps its trace (a run's directory: TensorBoard's Profile tab
    then lists it under the run); None: not kept.  run_steps: the run's steps, when its closed
    loop will correct the time model (profile_model calibrates when that pays for them); None
    when the run needs a calibrated table, so that a table whose first profiling skipped
    calibration is profiled again (calibration.recalibrate_reason).
    """
    table = stale = None
    if os.path.exists(path):
        stale = calibration.recalibrate_reason(tables.load_table(path), run_steps)
    if stale or not os.path.exists(path):
        found = (f"the timing table at {path} cannot be used: {stale}" if stale
                 else f"no timing table at {path}")
        table_key = reuse.key(model, input_size=int(input_size), batch_size=int(batch_size),
                              num_classes=int(num_classes), optimizer=optimizer,
                              profiled=["load_or_profile", FIRST_WARMUP, FIRST_ITERATIONS])
        table = reuse.get(table_key, model, model_name)
        if table is not None and calibration.recalibrate_reason(table, run_steps):
            table = None
        if table is not None:
            log(f"{found}: reusing the one profiled in this process for the same model and "
                f"shapes")
            tables.save_table(table, path)
        else:
            log(f"{found}: profiling this configuration {'again' if stale else 'first'} "
                f"(profiler.py)")
            table = _profile_first(path, model, model_name, input_size, batch_size,
                                   num_classes, seed, progress, optimizer, in_child, trace_dir,
                                   run_steps)
            log(phases_text(table.get("profiling_phases_s"),
                            "in a child process" if in_child else "in this process"))
            log(report.summarize(table))
            reuse.put(table_key, table)
    loaded = tables.load_table(path, model=model, input_size=input_size,
                               batch_size=batch_size, optimizer=optimizer)
    if table is not None:  # a child's phases around profile_model's are not in the file
        loaded["profiling_phases_s"] = table["profiling_phases_s"]
    return loaded


def _profile_first(path, model, model_name, input_size, batch_size, num_classes, seed,
                   progress, optimizer, in_child, trace_dir, run_steps):
    if in_child:
        return child.profile_in_child(path, model_name, input_size, batch_size, num_classes,
                                seed=seed, progress=progress, optimizer=optimizer,
                                names=[flavors.tensor_name(v) for v in model.trainable_weights],
                                shapes=[list(v.shape) for v in model.trainable_weights],
                                trace_dir=trace_dir, run_steps=run_steps)
    table = profile_model(model, model_name, input_size, batch_size, num_classes,
                          num_iterations=FIRST_ITERATIONS, warmup=FIRST_WARMUP,
                          progress=progress, seed=seed, optimizer=optimizer,
                          trace_dir=trace_dir, run_steps=run_steps)
    tables.save_table(table, path)
    release_memory()
    return table


def child_main():
    """Entry point of child.profile_in_child's process: argv[1] is the request file."""
    started = time.time()  # after the interpreter's start and this module's imports
    with open(sys.argv[1]) as f:
        req = json.load(f)
    status = {"ok": False}
    code = 1
    try:
        phases = Phases()
        table = _profile_request(req, phases)
        tables.save_table(table, req["path"])
        phases.mark("write_table")
        status, code = {"ok": True, "peak_rss_mb": table["peak_rss_mb"], "started": started,
                        "phases": phases.seconds}, 0
    except UserError as e:
        status["error"] = one_line(e)
        code = 2
    except KeyboardInterrupt:
        status["error"] = "interrupted"
        code = 130
    except Exception as e:  # noqa: BLE001  (reported to the parent as one line)
        status["error"] = f"{type(e).__name__}: {one_line(e)}"
    status["finished"] = time.time()
    with open(req["status"], "w") as f:
        json.dump(status, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # The table and the status are written and closed: skip the interpreter's and TensorFlow's
    # teardown (about 1 s on 2 cores), which the parent would otherwise wait for.
    os._exit(code)


def _profile_request(req, phases):
    from elastictrainer.models.build import build_sized

    model, _, _ = build_sized(req["model_name"], req["input_size"], req["num_classes"], "none")
    phases.mark("build_model")
    variables = model.trainable_weights
    if req.get("shapes") is not None:
        shapes = [list(v.shape) for v in variables]
        if shapes != req["shapes"]:
            raise UserError(f"{req['model_name']} rebuilt for profiling has other trainable "
                            f"tensors ({len(shapes)}) than the model being trained "
                            f"({len(req['shapes'])})")
    table = profile_model(model, req["model_name"], req["input_size"], req["batch_size"],
                          req["num_classes"], num_iterations=FIRST_ITERATIONS,
                          warmup=FIRST_WARMUP, seed=req["seed"], progress=req["progress"],
                          optimizer=req["optimizer"], trace_dir=req.get("trace_dir"),
                          run_steps=req.get("run_steps"))
    if req.get("names") is not None:
        for t, name in zip(table["tensors"], req["names"]):
            t["name"] = name
    phases.mark("profile")
    phases.split("profile", table["profiling_phases_s"])
    return table


def profile_configuration(model_name, input_size=224, batch_size=4, num_classes=None,
                          weights="none", num_iterations=5, warmup=2, output=None,
                          trace_dir=None, seed=0, progress=True, calibrate=True,
                          optimizer="sgd", log=print):
    """Build the model, profile it, write the table; return (table, path).  A saved model
    brings its own input size, which the table is profiled at (said when it is not
    `input_size`)."""
    from elastictrainer.models.build import build_sized

    asked = int(input_size)
    model, input_size, num_classes = build_sized(model_name, input_size, num_classes, weights)
    if input_size != asked:
        log(f"note: {model_name} takes {input_size}x{input_size} images: profiled at "
            f"{input_size}, not --input_size {asked} (its table is the one train reads with "
            f"--input_size {input_size})")
    output = output or tables.default_table_path(model_name, input_size, batch_size, num_classes,
                                                 optimizer)
    stem = os.path.splitext(os.path.basename(output))[0]
    trace_dir = trace_dir or tables.default_trace_dir(stem)
    table = profile_model(model, model_name, input_size, batch_size, num_classes,
                          num_iterations=num_iterations, warmup=warmup, trace_dir=trace_dir,
                          seed=seed, progress=progress, calibrate=calibrate, optimizer=optimizer)
    tables.save_table(table, output)
    return table, output
