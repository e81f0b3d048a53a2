"""The first profiling of the smallcnn setting: where its seconds go, and whether fewer profiled
steps keep the table as good.

    python scripts/bench_profiling.py compare --settings 2x5,1x3 --repeats 3
    python scripts/bench_profiling.py time --sources OLD_CHECKOUT,. --repeats 3

compare: profiles the smallcnn setting's model in this process under each --settings (WARMUPxSTEPS),
interleaved, and sets every table against the first table of the first setting: per-tensor t_dw and
t_dy, the forward share, the calibration, and the selections eq. 3 makes at rho 0.5 for a few
importance vectors (uniform, deeper is less important, random).  Differences between repeats of one
setting are the run-to-run noise the others are judged by.
time: a fresh process per run (as a training run is when it profiles first) builds the smallcnn
setting's model from --weights synthetic, then times load_or_profile into a new path; the --sources
checkouts alternate, and each process logs its profiling's phases.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the smallcnn setting's model and shapes
MODEL, SIZE, BATCH, CLASSES, OPTIMIZER = "smallcnn", 64, 32, 10, "adam"
RHO = 0.5


def importance_vectors(n, seeds=(0, 1, 2)):
    # trainable order: input first, so "deeper less" grows towards the output
    vectors = {"uniform": np.ones(n), "deeper less": np.linspace(0.1, 1.0, n)}
    for s in seeds:
        vectors[f"random {s}"] = np.random.default_rng(s).uniform(0.0, 1.0, n)
    return vectors


def selections(table):
    from elastictrainer.method.time_model import TimeModel

    tm = TimeModel(table)
    n = len(table["tensors"])
    return {name: tuple(int(i) for i in np.nonzero(tm.select(imp, RHO))[0])
            for name, imp in importance_vectors(n).items()}


def relative_diffs(a, b, key):
    """|a - b| / mean per tensor, over tensors holding at least 1% of the table's `key` time."""
    x = np.array([t[key] for t in a["tensors"]])
    y = np.array([t[key] for t in b["tensors"]])
    keep = (x + y) / 2 >= 0.01 * max((x + y).sum() / 2, 1e-12)
    return np.abs(x - y)[keep] / np.maximum((x + y)[keep] / 2, 1e-12)


def predicted_ratios(table, masks):
    from elastictrainer.method.time_model import TimeModel

    tm = TimeModel(table)
    return np.array([tm.predicted_ratio(m) for m in masks])


def versus(a, b):
    """`a` against the reference `b`: per-tensor times, the full step, the forward share, the
    calibration, the step ratios each predicts for `b`'s selections (what the time model is
    asked in a run; a machine's load that slows every op alike cancels out of them) and how
    many selections are the same."""
    dw, dy = relative_diffs(a, b, "t_dw_ms"), relative_diffs(a, b, "t_dy_ms")
    ca, cb = a["calibration"], b["calibration"]
    n = len(b["tensors"])
    masks = [np.isin(np.arange(n), sel) for sel in selections(b).values()]
    ratio_diff = np.abs(predicted_ratios(a, masks) - predicted_ratios(b, masks))
    return {"t_dw median/max %": (100 * np.median(dw), 100 * dw.max()),
            "t_dy median/max %": (100 * np.median(dy), 100 * dy.max()),
            "t_full %": 100 * abs(a["t_full_ms"] / b["t_full_ms"] - 1),
            "fp share diff": abs(a["t_fp_ms"] / a["t_full_ms"] - b["t_fp_ms"] / b["t_full_ms"]),
            "dw scale %": 100 * abs(ca["dw_scale"] / cb["dw_scale"] - 1),
            "dy scale %": 100 * abs(ca["dy_scale"] / cb["dy_scale"] - 1),
            "ratio diff median/max": (np.median(ratio_diff), ratio_diff.max()),
            "same selections": sum(s == t for s, t in zip(selections(a).values(),
                                                          selections(b).values()))}


def compare(args):
    from elastictrainer.models.build import build_sized
    from elastictrainer.profiler import run as prun

    model, _, _ = build_sized(MODEL, SIZE, CLASSES, "synthetic", progress=False)
    settings = [tuple(int(v) for v in s.split("x")) for s in args.settings.split(",")]
    tables = {s: [] for s in settings}
    for rep in range(args.repeats):
        for warmup, steps in (settings if rep % 2 == 0 else settings[::-1]):
            t = prun.profile_model(model, MODEL, SIZE, BATCH, CLASSES, num_iterations=steps,
                                   warmup=warmup, progress=False, optimizer=OPTIMIZER)
            tables[(warmup, steps)].append(t)
            print(f"{warmup}x{steps} repeat {rep}: {t['profiling_wall_s']:.1f} s, full step "
                  f"{t['t_full_ms']:.1f} ms, selections {selections(t)}", flush=True)
    ref = tables[settings[0]][0]
    n_sel = len(importance_vectors(len(ref["tensors"])))
    print(f"\nagainst {settings[0][0]}x{settings[0][1]} repeat 0 (selections: of {n_sel}):")
    for s in settings:
        for k, t in enumerate(tables[s]):
            if t is ref:
                continue
            row = versus(t, ref)
            print(f"  {s[0]}x{s[1]} repeat {k}: " + ", ".join(
                f"{key} " + ("/".join(f"{v:.3g}" for v in val) if isinstance(val, tuple)
                             else f"{val:.3g}") for key, val in row.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({f"{w}x{n}": ts for (w, n), ts in tables.items()}, f)


_CHILD = """
import json, sys, time
from elastictrainer.models.build import build_sized
from elastictrainer.profiler import run as prun
try:
    from elastictrainer import Config
    from elastictrainer.runs.setup import profiles_in_child
    in_child = profiles_in_child(Config(), False, False)
except ImportError:  # a checkout from before --profile_in: a run profiled in a child
    in_child = True
model, _, _ = build_sized({model!r}, {size}, {classes}, "synthetic", progress=False)
lines = []
t0 = time.perf_counter()
prun.load_or_profile({path!r}, model, {model!r}, {size}, {batch}, {classes}, progress=False,
                     optimizer={optimizer!r}, log=lines.append, in_child=in_child)
seconds = time.perf_counter() - t0
print(json.dumps({{"seconds": seconds, "in_child": in_child,
                   "log": [l for l in lines if l.startswith("profiled")]}}))
"""


def time_sources(args):
    sources = [os.path.abspath(s) for s in args.sources.split(",")]
    seconds = {s: [] for s in sources}
    work = tempfile.mkdtemp(prefix="et_bench_profiling_")
    for rep in range(args.repeats):
        for src in (sources if rep % 2 == 0 else sources[::-1]):
            path = os.path.join(work, f"{os.path.basename(src)}_{rep}.json")
            code = _CHILD.format(model=MODEL, size=SIZE, classes=CLASSES, batch=BATCH,
                                 optimizer=OPTIMIZER, path=path)
            env = dict(os.environ, PYTHONPATH=src)
            out = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            result = json.loads(out)
            seconds[src].append(result["seconds"])
            with open(path) as f:
                chosen = selections(json.load(f))
            print(f"{src} repeat {rep}: {result['seconds']:.1f} s (in a child: "
                  f"{result['in_child']})  {' | '.join(result['log'])}\n  selections at rho "
                  f"{RHO}: {chosen}", flush=True)
    for src, s in seconds.items():
        print(f"{src}: median {statistics.median(s):.1f} s of {', '.join(f'{v:.1f}' for v in s)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--settings", default="2x5,1x3", help="WARMUPxSTEPS, comma-separated")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--out", default=None, help="a JSON file for every table")
    t = sub.add_parser("time")
    t.add_argument("--sources", required=True, help="checkouts, comma-separated")
    t.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    return compare(args) if args.what == "compare" else time_sources(args)


if __name__ == "__main__":
    sys.exit(main())
