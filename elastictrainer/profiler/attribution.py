"""Per-op trace times -> per-tensor t_dw and t_dy in ms per step (paper Sec. 5).

The paper's time model (eq. 3) needs, for every trainable tensor k ordered from the output back:
  t_dw[k]  time of the work only tensor k's training needs (its weight gradient and update), and
  t_dy[k]  time of the error-gradient work that becomes necessary once anything at or below k
           trains,
so that a selection whose deepest tensor is d costs  T_fp + sum_sel t_dw + sum_{j<=d} t_dy[j].
"""
import re
from collections import defaultdict

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


def fill_estimates(t_dw, covered, flops):
    """t_dw with every tensor the trace missed (covered False) estimated from its FLOPs, at the
    ms-per-FLOP rate of the measured tensors; returns (t_dw, estimated flags)."""
    t_dw = list(t_dw)
    estimated = [not c for c in covered]
    timed = [k for k in range(len(t_dw)) if not estimated[k] and t_dw[k] > 0]
    timed_flops = sum(flops[k] for k in timed)
    rate = sum(t_dw[k] for k in timed) / timed_flops if timed_flops > 0 else 0.0
    for k, est in enumerate(estimated):
        if est:
            t_dw[k] = flops[k] * rate
    return t_dw, estimated


_UNIQUIFIED = re.compile(r"^(.*)_\d+$")


def forward_by_layer(info, op_times, num_steps, layer_names, suffixed=False):
    """Traced forward op time (ms per step) of each layer in `layer_names`: every forward op is
    charged to the innermost scope of its name that is a layer's.  `suffixed`: the scopes are
    the layers' names with a "_<n>" suffix (Keras 3 makes each layer's scope unique: layer
    "conv2d" runs in "conv2d_1", layer "conv2d_1" in "conv2d_1_1"), so a scope names the layer
    without its suffix; otherwise a scope is its layer's name, or that name made unique by
    TensorFlow when nothing else has it.  Ops of no layer (the loss) are left out, so the
    values sum to at most the traced forward time.  What a cached step leaves out of the
    forward pass is, in part, the time of its prefix's layers, measured here, augmentation
    included, where FLOP estimates have none."""
    names = set(layer_names)
    out = defaultdict(float)
    for name, total in op_times.items():
        if info.lookup(name)[0] != "forward":
            continue
        for scope in reversed(name.split("/")[:-1]):
            m = _UNIQUIFIED.match(scope)
            stripped = m.group(1) if m and m.group(1) in names else None
            layer = stripped if suffixed else (scope if scope in names else stripped)
            if layer is not None:
                out[layer] += total / num_steps
                break
    return dict(out)
