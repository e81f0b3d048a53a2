"""Tensor Timing Profiler (paper Sec. 5): per-tensor backward times from a real TensorFlow trace.

The paper's time model (eq. 3) needs, for every trainable tensor k ordered from the output back:
  t_dw[k]  time of the work only tensor k's training needs (its weight gradient and update), and
  t_dy[k]  time of the error-gradient work that becomes necessary once anything at or below k trains,
so that a selection whose deepest tensor is d costs  T_fp + sum_sel t_dw + sum_{j<=d} t_dy[j].

Attribution is generic, with no per-model code: we trace the very training step that training
runs, and for every op of that graph compute, by dataflow, the set S of tensors whose gradient
(or update) needs it.  |S| = 1: the op is t_dw of that tensor.  |S| > 1: the op runs as soon as
any tensor in S trains, i.e. once the deepest selected tensor reaches the output-most member of
S, so it is t_dy of that member.  When S is a suffix of the output-back order (a chain) this is
exact; on branches it is the paper's prefix approximation.  Op times come from the .xplane.pb
that tf.profiler writes, read with TensorFlow's bundled protobuf (the profile plugin's tables
stop at 500 rows).
"""
import common  # noqa: F401

import datetime
import glob
import json
import math
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections import defaultdict

import numpy as np

from common import UserError

TABLE_VERSION = 1
# A calibration whose fitted ratios miss a timed reference by more than this was likely made on a
# busy machine (measured here: 1.2-4.1% idle, 11% while the test suite ran).
NOISY_CALIBRATION = 0.10
PROFILE_DIR = "profiles"
REQUIRED_KEYS = ("model", "input_size", "batch_size", "num_classes", "t_fp_ms", "t_bp_ms",
                 "t_full_ms", "coverage", "unattributed", "tensors")

# Call ops wrap other traced ops; counting them too would count their contents twice.
_CALL_OP_TYPES = {"PartitionedCall", "StatefulPartitionedCall", "While", "If", "StatelessIf",
                  "StatelessWhile", "Case"}
_OP_EVENT = re.compile(r"^([^\s:]+):([A-Za-z0-9_]+)$")


def default_table_path(model_name, input_size, batch_size, num_classes, folder=PROFILE_DIR):
    """Where the profiler writes, and training looks for, a model configuration's table."""
    stem = os.path.splitext(os.path.basename(str(model_name)))[0]
    return os.path.join(folder, f"{stem}_i{input_size}_b{batch_size}_c{num_classes}.json")


# --------------------------------------------------------------------------- graph dataflow
def slot_owners(variables, optimizer_variables):
    """(slot variable, tensor index) pairs: Keras names a slot '<slot>/<weight name>'."""
    by_name = {}
    for k, v in enumerate(variables):
        by_name.setdefault(v.name, k)
    pairs = []
    for ov in optimizer_variables:
        parts = ov.name.split("/", 1)
        k = by_name.get(parts[1]) if len(parts) == 2 else None
        if k is not None and ov.shape == variables[k].shape:
            pairs.append((ov, k))
    return pairs


class GraphInfo:
    """Per-op classification of a traced training step.

    kind[name] is 'forward' (an ancestor of the loss), 'backward' (an ancestor of some weight
    gradient), 'update' (fed by a gradient or by a trainable variable outside the forward pass:
    the optimizer's work) or 'other'; mask[name] is the bit set S of trainable-tensor indices
    (model.trainable_weights order) that need the op.
    """

    def __init__(self, graph, loss, grads, variables, optimizer_variables=()):
        ops = graph.get_operations()  # creation order, which is topological for these graphs
        self.ops = {op.name: op for op in ops}
        self.n = len(variables)
        forward = set()
        stack = [loss.op]
        while stack:
            op = stack.pop()
            if op.name in forward:
                continue
            forward.add(op.name)
            stack.extend(t.op for t in op.inputs)
        self.forward = forward

        anc = defaultdict(int)
        for k, g in enumerate(grads):
            if g is not None:
                anc[g.op.name] |= 1 << k
        for op in reversed(ops):
            m = anc.get(op.name, 0)
            if m:
                for t in op.inputs:
                    anc[t.op.name] |= m

        # Descendant sets, tracked per output tensor: the optimizer's work for a tensor reads
        # its variable handle or its gradient.  Forward ops only emit their own handle bits and
        # backward ops only the gradients they produce, or every update would look shared.
        by_id = {id(v.handle): k for k, v in enumerate(variables)}
        for slot, k in slot_owners(variables, optimizer_variables):
            by_id[id(slot.handle)] = k  # momentum/Adam slots are that tensor's update work too
        handle_bits = defaultdict(int)
        for external, internal in graph.captures:
            k = by_id.get(id(external))
            if k is not None:
                handle_bits[internal.op.name] |= 1 << k
        grad_bits = defaultdict(int)
        for k, g in enumerate(grads):
            if g is not None:
                grad_bits[g.name] |= 1 << k
        out_mask, desc = {}, {}
        for op in ops:
            in_masks = [out_mask.get(t.name, 0) for t in op.inputs]
            m = handle_bits.get(op.name, 0)
            for x in in_masks:
                m |= x
            desc[op.name] = m
            for j, t in enumerate(op.outputs):
                if op.name in forward:
                    out_mask[t.name] = handle_bits.get(op.name, 0)
                elif anc.get(op.name, 0):
                    out_mask[t.name] = grad_bits.get(t.name, 0)
                elif op.type in ("Identity", "IdentityN") and j < len(in_masks):
                    out_mask[t.name] = in_masks[j]  # pass-through: output j is input j
                else:
                    out_mask[t.name] = m

        self.kind, self.mask = {}, {}
        for op in ops:
            name = op.name
            if name in forward:
                self.kind[name], self.mask[name] = "forward", 0
            elif anc.get(name, 0):
                self.kind[name], self.mask[name] = "backward", anc[name]
            elif desc.get(name, 0):
                self.kind[name], self.mask[name] = "update", desc[name]
            else:
                self.kind[name], self.mask[name] = "other", 0

        # Backprop order: tape.gradient creates output-side gradients first, so the creation
        # position of each tensor's gradient op ranks tensors from the output back (rank 0).
        self.grad_ops = [g.op.name if g is not None else None for g in grads]
        position = {op.name: i for i, op in enumerate(ops)}
        key = [(position[g.op.name] if g is not None else len(ops), -k) for k, g in enumerate(grads)]
        order = sorted(range(self.n), key=lambda k: key[k])
        self.rank = [0] * self.n
        for r, k in enumerate(order):
            self.rank[k] = r

        self._scopes = None

    def lookup(self, name):
        """(kind, mask) of a traced op name; grappler-made names fall back to their name scope."""
        if name in self.kind:
            return self.kind[name], self.mask[name]
        if self._scopes is None:
            self._scopes = defaultdict(list)
            for op_name in self.kind:
                parts = op_name.split("/")
                for cut in range(1, len(parts)):
                    self._scopes["/".join(parts[:cut])].append(op_name)
        parts = name.split("/")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = "/".join(parts[:cut])
            if prefix in self.kind:  # a rewrite of one op keeps that op's name as its scope
                return self.kind[prefix], self.mask[prefix]
            members = self._scopes.get(prefix)
            if members:
                kinds = [self.kind[m] for m in members]
                if all(k == "forward" for k in kinds):
                    return "forward", 0
                mask = 0
                for m in members:
                    if self.kind[m] in ("backward", "update"):
                        mask |= self.mask[m]
                return ("backward", mask) if mask else ("other", 0)
        return None, 0

    def fused_cover(self, name, kernel_type):
        """Extra tensors a fused kernel computes the gradient of (oneDNN's ...WithBias kernels
        fold the BiasAddGrad that reads the same output gradient into the filter gradient)."""
        op = self.ops.get(name)
        if op is None or not kernel_type.endswith("WithBias"):
            return 0
        inputs = {t.name for t in op.inputs}
        cover = 0
        for t in op.inputs:
            for consumer in t.consumers():
                if consumer.type == "BiasAddGrad" and consumer.inputs[0].name in inputs:
                    cover |= self.mask.get(consumer.name, 0)
        return cover

    def dw_flops(self, variables, batch_size):
        """Rough FLOPs of each tensor's exclusive gradient work: 2 x |w| x positions summed over,
        taken from the static shapes of the inputs of its exclusive backward ops."""
        positions = [0] * self.n
        for name, kind in self.kind.items():
            m = self.mask[name]
            if kind != "backward" or m & (m - 1):
                continue
            k = m.bit_length() - 1
            for t in self.ops[name].inputs:
                shape = t.shape
                if shape.rank and shape.rank >= 2 and shape.is_fully_defined():
                    dims = shape.as_list()
                    positions[k] = max(positions[k], int(np.prod(dims[:-1])))
        return [2.0 * int(np.prod(v.shape)) * (positions[k] or batch_size)
                for k, v in enumerate(variables)]


# --------------------------------------------------------------------------- trace reading
def find_xplane(logdir):
    """The newest .xplane.pb under a tf.profiler log directory."""
    files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"tf.profiler wrote no .xplane.pb under {logdir}")
    return files[-1]


def read_op_times(xplane_path):
    """Total time (ms) and kernel type of every TensorFlow op in a trace, by op (node) name.

    Host ops are executor events named 'node:KernelType'.  Ops that ran on an accelerator are
    timed by the kernels that carry their name in the 'tf_op' stat of the device planes, which
    replace the host-side launch time.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    host = defaultdict(float)
    device = defaultdict(float)
    kernel_type = {}
    for plane in space.planes:
        is_device = plane.name.startswith("/device:") and not plane.name.startswith("/device:CPU")
        if not (is_device or plane.name.startswith("/host:")):
            continue
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                md = plane.event_metadata[ev.metadata_id]
                if is_device:
                    tf_op = None
                    for s in list(ev.stats) + list(md.stats):
                        if stat_names.get(s.metadata_id) == "tf_op":
                            tf_op = s.str_value or (plane.stat_metadata[s.ref_value].name
                                                    if s.ref_value else None)
                            break
                    m = _OP_EVENT.match(tf_op or "")
                    if m:
                        device[m.group(1)] += ev.duration_ps / 1e9
                        kernel_type.setdefault(m.group(1), m.group(2))
                    continue
                m = _OP_EVENT.match(md.name)
                if not m or m.group(2) in _CALL_OP_TYPES:
                    continue
                host[m.group(1)] += ev.duration_ps / 1e9
                kernel_type.setdefault(m.group(1), m.group(2))
    times = dict(host)
    times.update(device)
    return times, kernel_type


# --------------------------------------------------------------------------- attribution
def attribute(info, op_times, kernel_type, num_steps):
    """Turn per-op trace times into per-tensor (t_dw, t_dy) in ms per step (see module doc)."""
    n = info.n
    t_dw = [0.0] * n
    t_dy = [0.0] * n
    # A tensor is measured when a backward op of its own, or the op producing its gradient, was
    # traced (or fused into a traced kernel): grappler drops trailing no-op reshapes, so the
    # gradient's own op may be absent.  Shared ops and optimizer updates cannot vouch for one.
    grad_op_of = defaultdict(int)
    for k, g in enumerate(info.grad_ops):
        if g is not None:
            grad_op_of[g] |= 1 << k
    covered = 0
    fwd_ms = attributed_ms = 0.0
    unattributed = defaultdict(float)
    by_rank = sorted(range(n), key=lambda k: info.rank[k])
    for name, total in op_times.items():
        ms = total / num_steps
        kind, mask = info.lookup(name)
        if kind == "forward":
            fwd_ms += ms
            continue
        if kind not in ("backward", "update") or not mask:
            unattributed[name] += ms
            continue
        attributed_ms += ms
        parts = name.split("/")
        for cut in range(len(parts), 0, -1):
            covered |= grad_op_of.get("/".join(parts[:cut]), 0)
        covered |= info.fused_cover(name, kernel_type.get(name, ""))
        if mask & (mask - 1) == 0:
            t_dw[mask.bit_length() - 1] += ms
            if kind == "backward":
                covered |= mask
        else:
            members = [k for k in by_rank if mask >> k & 1]
            t_dy[members[0]] += ms
    unatt_ms = sum(unattributed.values())
    total_bp = attributed_ms + unatt_ms
    return {
        "t_dw": t_dw, "t_dy": t_dy,
        "covered": [bool(covered >> k & 1) for k in range(n)],
        "t_fp_ops_ms": fwd_ms, "t_bp_ops_ms": total_bp,
        "coverage": attributed_ms / total_bp if total_bp > 0 else 1.0,
        "unattributed": sorted(({"name": k, "ms": v} for k, v in unattributed.items()),
                               key=lambda d: -d["ms"]),
    }


# --------------------------------------------------------------------------- profiling run
# --------------------------------------------------------------------------- calibration
def selection_sums(t_dw, t_dy, rank, mask):
    """(sum of t_dw over the selection, sum of t_dy from the output down to its deepest tensor):
    the two terms of eq. 3's backward cost."""
    mask = np.asarray(mask, bool)
    if not mask.any():
        return 0.0, 0.0
    rank = np.asarray(rank)
    deepest = int(rank[mask].max())
    return float(np.asarray(t_dw)[mask].sum()), float(np.asarray(t_dy)[rank <= deepest].sum())


def uniform_scale(t_dw, t_dy, t_fp, t_full):
    """The one factor that makes the summed op times of a full selection equal the measured
    backward pass (t_full - t_fp): the time model's scale without calibration."""
    ops = float(np.sum(t_dw) + np.sum(t_dy))
    return (t_full - t_fp) / ops if ops > 0 else 0.0


def reference_selections(rank):
    """Selections timed to calibrate the time model, as {name: mask}: the error gradient alone
    down to the input and down to half depth (one tensor trained), and everything in the
    output-most half.  With the full step they pull t_dw's and t_dy's scales apart."""
    rank = np.asarray(rank)
    n = len(rank)
    half = max(0, (n - 1) // 2)
    refs = {
        "dy_to_input": rank == n - 1,
        "dy_to_half": rank == half,
        "all_to_half": rank <= half,
    }
    return {k: m for k, m in refs.items() if m.any()}


def fit_calibration(t_dw, t_dy, rank, t_fp, t_full, measured):
    """Separate scales for the dw and dy op times, fitted to measured step-time ratios.

    Summed op times overstate the backward pass whenever ops run concurrently: weight-gradient
    ops hang off the error-gradient chain and overlap with it, so they cost less wall time than
    their op time, and the chain itself more.  One uniform scale then under-predicts selections
    that are mostly chain (deep, few tensors).  We fit  ratio = (t_fp + a*DW + b*DY) / t_full
    by least squares over `measured` ({name: (mask, ratio)}), constrained so that the full
    selection still predicts exactly t_full, with a, b >= 0.  Returns (a, b).
    """
    t_dw, t_dy = np.asarray(t_dw, float), np.asarray(t_dy, float)
    dw_all, dy_all = t_dw.sum(), t_dy.sum()
    budget = t_full - t_fp
    uniform = uniform_scale(t_dw, t_dy, t_fp, t_full)
    if dw_all <= 0 or dy_all <= 0 or budget <= 0 or not measured:
        return uniform, uniform
    # b = (budget - a*dw_all)/dy_all; the residual is linear in a
    num = den = 0.0
    for mask, ratio in measured.values():
        dw, dy = selection_sums(t_dw, t_dy, rank, mask)
        u = dw - dw_all * dy / dy_all
        target = ratio * t_full - t_fp - budget * dy / dy_all
        num += u * target
        den += u * u
    if den <= 0:
        return uniform, uniform
    a = min(max(num / den, 0.0), budget / dw_all)
    return a, (budget - a * dw_all) / dy_all


def _time_reference_selections(model, optimizer, loss_fn, variables, full_step, rank, x, y,
                               rounds, bar):
    """Median step time of each reference selection over the full step's, interleaved."""
    import engine

    refs = reference_selections(rank)
    steps = {"full": full_step}
    for name, mask in refs.items():
        steps[name] = engine.make_train_step(
            model, optimizer, loss_fn, [v for v, m in zip(variables, mask) if m])
        steps[name](x, y)[0].numpy()  # compile
        steps[name](x, y)[0].numpy()
        bar.update(1)
    ratios = {name: [] for name in refs}
    for r in range(rounds):
        names = list(steps) if r % 2 == 0 else list(steps)[::-1]  # drift hits all alike
        times = {}
        for name in names:
            t = []
            for _ in range(2):
                t0 = time.perf_counter()
                steps[name](x, y)[0].numpy()
                t.append(time.perf_counter() - t0)
            times[name] = min(t)
        for name in refs:  # ratios within a round, so load that comes and goes cancels out
            ratios[name].append(times[name] / times["full"])
        bar.update(1)
    return {name: (mask, statistics.median(ratios[name])) for name, mask in refs.items()}


def profile_model(model, model_name, input_size, batch_size, num_classes, num_iterations=5,
                  warmup=2, trace_dir=None, seed=0, progress=True, calibrate=True):
    """Profile full training steps of `model` and return the timing table (a JSON-able dict).

    Runs `warmup` steps, then times forward-only and full training steps interleaved
    (median wall time: t_fp, t_full; t_bp = t_full - t_fp, measured, not the 2 x forward rule),
    then traces `num_iterations` full steps under tf.profiler and attributes their ops.
    With `calibrate`, a few reference selections are then timed for real to fit separate
    t_dw / t_dy scales (fit_calibration).  The model's weights are restored afterwards.
    """
    import tensorflow as tf
    import tf_keras as keras
    from tqdm import tqdm

    import engine

    if num_iterations < 1:
        raise UserError("--num_iterations must be at least 1")
    wall0 = time.perf_counter()
    variables = list(model.trainable_weights)
    if not variables:
        raise UserError("the model has no trainable weights to profile")
    saved = model.get_weights()
    optimizer = keras.optimizers.SGD(1e-4, momentum=0.9, weight_decay=5e-4)
    engine.prepare_optimizer(optimizer, variables)
    loss_fn = engine.make_loss()
    capture = {}
    step = engine.make_train_step(model, optimizer, loss_fn, variables, capture=capture)
    forward = engine.make_forward_step(model, loss_fn)

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.uniform(0, 255, (batch_size, input_size, input_size, 3)), tf.float32)
    y = tf.constant(rng.integers(0, num_classes, batch_size), tf.int32)

    n_refs = len(reference_selections(np.arange(len(variables)))) if calibrate else 0
    bar = tqdm(total=warmup + 3 * num_iterations + (n_refs + num_iterations if n_refs else 0),
               desc="profiling",
               disable=not progress, unit="step")
    for _ in range(warmup):
        step(x, y)[0].numpy()
        forward(x, y)[0].numpy()
        bar.update(1)
    graph = step.get_concrete_function(x, y).graph
    info = GraphInfo(graph, capture["loss"], capture["grads"], variables, optimizer.variables)

    fp, full = [], []
    for _ in range(num_iterations):
        t0 = time.perf_counter()
        forward(x, y)[0].numpy()
        fp.append(time.perf_counter() - t0)
        bar.update(1)
        t0 = time.perf_counter()
        step(x, y)[0].numpy()
        full.append(time.perf_counter() - t0)
        bar.update(1)

    own_dir = trace_dir is None
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="et_trace_")
    tf.profiler.experimental.start(trace_dir)
    try:
        for _ in range(num_iterations):
            step(x, y)[0].numpy()
            bar.update(1)
    finally:
        tf.profiler.experimental.stop()
    xplane = find_xplane(trace_dir)
    op_times, kernel_type = read_op_times(xplane)
    if own_dir:
        shutil.rmtree(trace_dir, ignore_errors=True)
    att = attribute(info, op_times, kernel_type, num_iterations)
    measured = {}
    if n_refs:
        measured = _time_reference_selections(model, optimizer, loss_fn, variables, step,
                                              info.rank, x, y, num_iterations, bar)
    bar.close()
    model.set_weights(saved)

    t_dw, t_dy = att["t_dw"], att["t_dy"]
    estimated = [not c for c in att["covered"]]
    if any(estimated):
        flops = info.dw_flops(variables, batch_size)
        measured = [k for k in range(len(variables)) if not estimated[k] and t_dw[k] > 0]
        rate = (sum(t_dw[k] for k in measured) / sum(flops[k] for k in measured)
                if measured and sum(flops[k] for k in measured) > 0 else 0.0)
        for k in range(len(variables)):
            if estimated[k]:
                t_dw[k] = flops[k] * rate

    t_fp = statistics.median(fp) * 1e3
    t_full = statistics.median(full) * 1e3
    calibration = None
    if measured:
        a, b = fit_calibration(t_dw, t_dy, info.rank, t_fp, t_full, measured)
        uniform = uniform_scale(t_dw, t_dy, t_fp, t_full)

        def ratio(scale_dw, scale_dy, mask):
            dw, dy = selection_sums(t_dw, t_dy, info.rank, mask)
            return (t_fp + scale_dw * dw + scale_dy * dy) / t_full

        calibration = {
            "dw_scale": a, "dy_scale": b, "uniform_scale": uniform,
            "references": [
                {"name": name, "selected": int(np.sum(mask)), "measured_ratio": r,
                 "uniform_ratio": ratio(uniform, uniform, mask), "calibrated_ratio": ratio(a, b, mask)}
                for name, (mask, r) in measured.items()],
        }
    table = {
        "version": TABLE_VERSION,
        "model": str(model_name),
        "input_size": int(input_size),
        "batch_size": int(batch_size),
        "num_classes": int(num_classes),
        "t_fp_ms": t_fp,
        "t_full_ms": t_full,
        "t_bp_ms": t_full - t_fp,
        "t_fp_ops_ms": att["t_fp_ops_ms"],
        "t_bp_ops_ms": att["t_bp_ops_ms"],
        "coverage": att["coverage"],
        "unattributed": att["unattributed"][:50],
        "num_iterations": int(num_iterations),
        "calibration": calibration,
        "tensors": [
            {"name": v.name, "shape": [int(d) for d in v.shape], "t_dw_ms": t_dw[k],
             "t_dy_ms": t_dy[k], "estimated": estimated[k], "rank": info.rank[k]}
            for k, v in enumerate(variables)
        ],
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "processor": platform.machine(),
                 "tensorflow": tf.__version__,
                 "devices": [d.name for d in tf.config.list_logical_devices()]},
        "trace": None if own_dir else xplane,
        "profiling_wall_s": time.perf_counter() - wall0,
    }
    return table


# --------------------------------------------------------------------------- table I/O
def save_table(table, path):
    import runlog

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    runlog.write_json(path, table)  # a table is either whole or absent, even if interrupted


def load_or_profile(path, model, model_name, input_size, batch_size, num_classes, seed=0,
                    progress=True, log=print):
    """The table at `path` for `model`, profiling `model` first when there is none."""
    if not os.path.exists(path):
        log(f"no timing table at {path}: profiling this configuration first (profiler.py)")
        table = profile_model(model, model_name, input_size, batch_size, num_classes,
                              progress=progress, seed=seed)
        save_table(table, path)
        log(summarize(table))
    return load_table(path, model=model, input_size=input_size, batch_size=batch_size)


def load_table(path, model=None, input_size=None, batch_size=None):
    """Read a timing table; reject a corrupt file or one made for another configuration."""
    if not os.path.exists(path):
        raise UserError(f"no timing table at {path}; run profiler.py first")
    try:
        with open(path) as f:
            table = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"corrupt timing table {path}: {e}") from None
    if not isinstance(table, dict):
        raise UserError(f"corrupt timing table {path}: not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in table]
    if missing:
        raise UserError(f"corrupt timing table {path}: missing {', '.join(missing)}")
    try:
        for t in table["tensors"]:
            for key in ("name", "t_dw_ms", "t_dy_ms"):
                t[key]
            if not (math.isfinite(t["t_dw_ms"]) and math.isfinite(t["t_dy_ms"])):
                raise ValueError("non-finite time")
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"corrupt timing table {path}: bad tensor entry ({e})") from None
    cal = table.get("calibration")
    if cal is not None:
        try:
            if not all(math.isfinite(cal[k]) and cal[k] >= 0 for k in ("dw_scale", "dy_scale")):
                raise ValueError("scales must be finite and >= 0")
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"corrupt timing table {path}: bad calibration ({e})") from None
    if input_size is not None and table["input_size"] != input_size:
        raise UserError(f"timing table {path} was profiled at input size {table['input_size']}, "
                        f"not {input_size}; re-run profiler.py")
    if batch_size is not None and table["batch_size"] != batch_size:
        raise UserError(f"timing table {path} was profiled at batch size {table['batch_size']}, "
                        f"not {batch_size}; re-run profiler.py")
    if model is not None:
        names = [v.name for v in model.trainable_weights]
        got = [t["name"] for t in table["tensors"]]
        if len(names) != len(got):
            raise UserError(f"timing table {path} has {len(got)} tensors but the model has "
                            f"{len(names)}; re-run profiler.py for this model")
        if names != got:
            first = next(i for i, (a, b) in enumerate(zip(names, got)) if a != b)
            raise UserError(f"timing table {path} does not match the model: tensor {first} is "
                            f"{got[first]!r} in the table, {names[first]!r} in the model")
    return table


def summarize(table):
    """One human-readable block about a table."""
    n = len(table["tensors"])
    est = sum(t["estimated"] for t in table["tensors"])
    lines = [
        f"model {table['model']}  input {table['input_size']}  batch {table['batch_size']}  "
        f"classes {table['num_classes']}  tensors {n} ({est} estimated)",
        f"forward {table['t_fp_ms']:.1f} ms  backward {table['t_bp_ms']:.1f} ms  "
        f"full step {table['t_full_ms']:.1f} ms  (t_fp/t_full {table['t_fp_ms'] / table['t_full_ms']:.2f})",
        f"backward op time attributed to tensors: {100 * table['coverage']:.1f}%",
    ]
    cal = table.get("calibration")
    if cal:
        worst = max((abs(r["calibrated_ratio"] / r["measured_ratio"] - 1) for r in cal["references"]),
                    default=0.0)
        lines.append(f"time model calibrated on {len(cal['references'])} timed selections: "
                     f"t_dw x{cal['dw_scale'] / cal['uniform_scale']:.2f}, "
                     f"t_dy x{cal['dy_scale'] / cal['uniform_scale']:.2f} of the uniform scale "
                     f"(worst reference error {100 * worst:.1f}%)")
        if worst > NOISY_CALIBRATION:
            lines.append("the timed selections disagree with the fit by more than "
                         f"{100 * NOISY_CALIBRATION:.0f}%: if the machine was busy, profile again "
                         "when it is idle")
    else:
        lines.append("time model not calibrated (one uniform scale for t_dw and t_dy)")
    if table["unattributed"]:
        top = ", ".join(f"{u['name']} {u['ms']:.2f} ms" for u in table["unattributed"][:3])
        lines.append(f"top unattributed: {top}")
    return "\n".join(lines)


def plot_table(table, path):
    """Bars of t_dw and t_dy per tensor from the input (left) to the output (right); PNG + PDF.
    Returns the PNG's path."""
    import plotting

    plt = plotting.pyplot()

    tensors = sorted(table["tensors"], key=lambda t: -t["rank"])
    n = len(tensors)
    x = np.arange(n)
    dw = np.array([t["t_dw_ms"] for t in tensors])
    dy = np.array([t["t_dy_ms"] for t in tensors])
    est = np.array([t["estimated"] for t in tensors])
    fig, ax = plt.subplots(figsize=(max(6.0, min(18.0, 0.08 * n + 4)), 3.6))
    ax.bar(x, dw, color="#1f77b4", label="t_dw (weight gradient + update)")
    ax.bar(x, dy, bottom=dw, color="#ff7f0e", label="t_dy (error gradient)")
    if est.any():
        ax.bar(x[est], dw[est], color="none", edgecolor="k", hatch="//", label="estimated (FLOPs)")
    ax.set_xlabel("tensor (input → output)")
    ax.set_ylabel("op time per step (ms)")
    ax.margins(x=0.01, y=0.08)  # the tallest bar clear of the frame
    ax.set_title(f"{table['model']}: input {table['input_size']}, batch {table['batch_size']}; "
                 f"forward {table['t_fp_ms']:.0f} ms, full step {table['t_full_ms']:.0f} ms")
    ax.set_xlim(-1, n)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return plotting.save_figure(fig, os.path.splitext(path)[0])[0]


def profile_configuration(model_name, input_size=224, batch_size=4, num_classes=None,
                          weights="none", num_iterations=5, warmup=2, output=None,
                          trace_dir=None, figure=None, seed=0, progress=True, calibrate=True):
    """Build the model, profile it, write the table (and its figure); return (table, path)."""
    import models

    model, input_size, num_classes = models.build_sized(model_name, input_size, num_classes, weights)
    output = output or default_table_path(model_name, input_size, batch_size, num_classes)
    stem = os.path.splitext(os.path.basename(output))[0]
    trace_dir = trace_dir or os.path.join(os.path.dirname(output) or ".", "traces", stem)
    table = profile_model(model, model_name, input_size, batch_size, num_classes,
                          num_iterations=num_iterations, warmup=warmup, trace_dir=trace_dir,
                          seed=seed, progress=progress, calibrate=calibrate)
    save_table(table, output)
    if figure != "":
        plot_table(table, figure or os.path.join("figures", f"profile_{stem}.png"))
    return table, output
