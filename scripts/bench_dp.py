"""Time the exact DP tensor-selection solver on ResNet50-sized random instances.

Usage (from the repo root):
    python scripts/bench_dp.py --n 214 --units 1000,10000 --repeats 20 [--out FILE.json]

``--units`` is the budget size T in integer time units (the DP table width);
each instance's times are scaled so that ``int(rho * total) == T``.
"""
import json
import os
import platform
import sys
import time

import numpy as np

from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.method.selector import select_tensors, selection_DP


def make_instance(rs, n, units, rho, zero_dy=False):
    """Random profile shaped like a conv net: heavy-tailed per-tensor times.

    zero_dy removes the error-gradient chain, which is the solver's worst case:
    the knapsack table then cannot shrink as the sweep goes deeper.
    """
    t_dw_ms = rs.lognormal(mean=0.0, sigma=1.0, size=n)
    t_dy_ms = rs.lognormal(mean=0.0, sigma=1.0, size=n)
    t_dy_ms[rs.rand(n) < 0.3] = 0.0  # e.g. BN/bias tensors share their layer's dy
    if zero_dy:
        t_dy_ms[:] = 0.0
    importance = np.abs(rs.randn(n)) * rs.lognormal(0.0, 1.0, size=n)
    # Scale so the integer budget is ~units, as the reference contract computes it.
    total_ms = float(np.sum(t_dw_ms + t_dy_ms))
    scale = units / (rho * total_ms)
    t_dw = np.rint(t_dw_ms * scale).astype(np.int64)
    t_dy = np.rint(t_dy_ms * scale).astype(np.int64)
    return t_dw, t_dy, importance, t_dw_ms, t_dy_ms


def time_calls(fn, repeats):
    fn()  # warm-up: first call pays numpy allocation/import costs
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def build_parser():
    ap = ArgumentParser(prog="bench_dp.py", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=214, help="number of tensors (ResNet50: 214)")
    ap.add_argument("--units", default="1000,10000", type=comma_list(int, "integers"),
                    help="comma-separated budget sizes in units")
    ap.add_argument("--repeats", type=int, default=20, help="timed solves per setting")
    ap.add_argument("--rho", type=float, default=0.5, help="budget fraction of the full backward pass")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random instances")
    ap.add_argument("--zero-dy", action="store_true",
                    help="worst case: all error-gradient times zero")
    ap.add_argument("--out", default=None, help="optional JSON file for the results")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    units_list = args.units

    rows = []
    print(f"N={args.n} rho={args.rho} zero_dy={args.zero_dy} repeats={args.repeats} "
          f"(python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus)")
    print(f"{'solver':<16}{'units':>8}{'budget':>8}{'median ms':>11}{'min ms':>9}{'selected':>10}")
    for units in units_list:
        rs = np.random.RandomState(args.seed)
        t_dw, t_dy, imp, t_dw_ms, t_dy_ms = make_instance(rs, args.n, units, args.rho, args.zero_dy)
        budget = int(args.rho * int(np.sum(t_dw + t_dy)))
        value, mask = selection_DP(t_dy, t_dw, imp, args.rho)
        ms = time_calls(lambda: selection_DP(t_dy, t_dw, imp, args.rho), args.repeats)
        rows.append(dict(solver="selection_DP", n=args.n, units=units, budget_units=budget,
                         median_ms=float(np.median(ms)), min_ms=float(np.min(ms)),
                         selected=int(mask.sum()), importance=value))
        budget_ms = args.rho * float(np.sum(t_dw_ms + t_dy_ms))
        res = select_tensors(t_dw_ms, t_dy_ms, imp, budget_ms, resolution=units)
        ms2 = time_calls(lambda: select_tensors(t_dw_ms, t_dy_ms, imp, budget_ms, resolution=units),
                         args.repeats)
        rows.append(dict(solver="select_tensors", n=args.n, units=units, budget_units=units,
                         median_ms=float(np.median(ms2)), min_ms=float(np.min(ms2)),
                         selected=int(res.mask.sum()), importance=res.importance))
        for r in rows[-2:]:
            print(f"{r['solver']:<16}{r['units']:>8}{r['budget_units']:>8}"
                  f"{r['median_ms']:>11.2f}{r['min_ms']:>9.2f}{r['selected']:>10}")

    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), results=rows), f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
