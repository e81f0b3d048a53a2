"""Does rho hold?  Measure the step-time ratio ElasticTrainer's selection really achieves.

For each requested rho: evaluate importance on a batch, solve eq. 3 with the profiled time model,
then time real training steps of that selection and of full training, interleaved in one run
(repetitions, medians).  Also: the time model's error on random selections, the DP solve time
and the RSS growth over re-selections.  Prints a table, writes JSON and a figure.

    python scripts/bench_speedup.py --model_name resnet50 --rhos 0.4,0.5,0.6,0.7 --out bench.json
"""
import os

from elastictrainer import config as common_flags, errors
from elastictrainer.config import ArgumentParser
from elastictrainer.errors import UserError


def build_parser():
    p = ArgumentParser(prog="bench_speedup.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_name", default="resnet50", help="built-in name or a .keras/.h5 file")
    p.add_argument("--input_size", type=int, default=224, help="image height and width")
    p.add_argument("--batch_size", type=int, default=4, help="training batch size")
    p.add_argument("--num_classes", type=int, default=200, help="(a saved model keeps its own)")
    p.add_argument("--rhos", default="0.4,0.5,0.6,0.7", type=common_flags.comma_list(float),
                   help="comma-separated requested ratios")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=3, help="timed steps per selection per round")
    p.add_argument("--random_selections", type=int, default=20,
                   help="random selections for the time model's error")
    p.add_argument("--reselections", type=int, default=30, help="re-selections for RSS growth")
    p.add_argument("--noise_trials", type=int, default=8,
                   help="measurements of one selection's ratio, as a run takes them, to show "
                        "their run-to-run noise")
    p.add_argument("--timing_table", default=None, help="reuse this table (default: profile or "
                                                        "reuse profiles/<model>...json)")
    p.add_argument("--importance", default="taylor", choices=("taylor", "uniform"),
                   help="taylor: eq. 4-6 on a random batch (with random-init weights many tensors "
                        "score <= 0 and are never worth selecting, so a high rho may not be used "
                        "up); uniform: every tensor equally important, so the budget binds")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch")
    p.add_argument("--out", default=None, help="JSON results (default: figures/bench_<model>.json)")
    p.add_argument("--figure", default=None, help="requested vs measured plot (default: next to --out)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _time_model_variants(table):
    """TimeModels of one table: "table" (as profiled: two scales and, where it fitted one,
    a fixed cost), "two_scales" (the same references fitted without the fixed cost) and
    "uniform" (no calibration)."""
    import copy

    import numpy as np

    from elastictrainer.profiler import calibration
    from elastictrainer.method.time_model import TimeModel

    out = {"table": TimeModel(table)}
    cal = table.get("calibration")
    bare = copy.deepcopy(table)
    bare["calibration"] = None
    out["uniform"] = TimeModel(bare)
    if cal:
        tensors = table["tensors"]
        rank = np.array([t["rank"] for t in tensors])
        t_dw = [t["t_dw_ms"] for t in tensors]
        t_dy = [t["t_dy_ms"] for t in tensors]
        masks = calibration.reference_selections(rank)
        measured = {r["name"]: (masks[r["name"]], r["measured_ratio"])
                    for r in cal["references"] if r["name"] in masks}
        a, b = calibration.fit_calibration(t_dw, t_dy, rank, table["t_fp_ms"],
                                           table["t_full_ms"], measured)
        two = copy.deepcopy(table)
        two["calibration"] = dict(cal, dw_scale=a, dy_scale=b, fixed_ms=0.0)
        out["two_scales"] = TimeModel(two)
    return out


def rss_mb():
    """Resident set size now (not the peak), in MB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_benchmark(model_name, input_size=224, batch_size=4, num_classes=200, rhos=(0.4, 0.5, 0.6, 0.7),
                  repeats=5, steps=3, random_selections=20, reselections=30, timing_table=None,
                  seed=0, progress=True, log=print, importance="taylor", noise_trials=8):
    import statistics
    import time

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from tqdm import tqdm

    from elastictrainer.flavors import optimizers
    from elastictrainer.method.importance import normalize, taylor_importance
    from elastictrainer.models import is_user_model
    from elastictrainer.models.build import build_sized
    from elastictrainer.profiler.run import load_or_profile
    from elastictrainer.profiler.table import default_table_path
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.method.schemes import SCHEMES
    from elastictrainer.method.time_model import TimeModel
    from elastictrainer.train.compiled import CompiledSteps

    for rho in rhos:
        if not 0 < rho <= 1:
            raise UserError(f"--rhos values must be in (0, 1], got {rho}")
    keras.utils.set_random_seed(seed)
    model, input_size, num_classes = build_sized(  # a saved model keeps its own head
        model_name, input_size, None if is_user_model(model_name) else num_classes)
    path = timing_table or default_table_path(model_name, input_size, batch_size, num_classes)
    table = load_or_profile(path, model, model_name, input_size, batch_size, num_classes,
                            seed=seed, progress=progress, log=log)
    tm = TimeModel(table)
    roles = tensor_roles(model)
    trainer = CompiledSteps(model, optimizers.make_optimizer("sgd", 1e-4, 5e-4, 10**6),
                      SCHEMES["elastic_training"], roles)
    trainer.steps.maxsize = max(8, len(rhos) + 2)
    n = len(trainer.variables)
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.uniform(0, 255, (batch_size, input_size, input_size, 3)), tf.float32)
    y = tf.constant(rng.integers(0, num_classes, batch_size), tf.int32)
    if importance == "uniform":
        importance = np.ones(len(trainer.variables))
    else:
        importance = normalize(taylor_importance(trainer, [(x, y)]))
    importance_kind = "uniform" if np.all(importance == 1) else "taylor"

    t0 = time.perf_counter()
    for _ in range(20):
        tm.select(importance, rhos[0])
    dp_ms = (time.perf_counter() - t0) / 20 * 1e3

    full = tuple(range(n))
    masks = {rho: tm.select(importance, rho) for rho in rhos}
    selections = {"full": full}
    selections.update({rho: tm.selection(m)[0] for rho, m in masks.items()})

    def timed(sel, count):
        step = trainer.step_for(sel)
        out = []
        for _ in range(count):
            t = time.perf_counter()
            step(x, y)[0].numpy()
            out.append(time.perf_counter() - t)
        return out

    bar = tqdm(total=len(selections) * (repeats + 1) + len(rhos) + 1 + random_selections + reselections,
               desc="benchmark", disable=not progress)
    for sel in selections.values():  # compile and warm up every step first
        timed(sel, 2)
        bar.update(1)
    times = {key: [] for key in selections}
    for r in range(repeats):
        keys = list(selections)
        if r % 2:
            keys.reverse()  # interleave so drift hits every selection alike
        for key in keys:
            times[key] += timed(selections[key], steps)
            bar.update(1)
    full_ms = statistics.median(times["full"]) * 1e3
    results = []
    for rho in rhos:
        sel_ms = statistics.median(times[rho]) * 1e3
        # "importance" / "depth" (time_model.limited_by): the DP stops short of the budget on
        # purpose (nothing left out is worth anything, or what is worth something is too deep
        # to reach); "budget": a tensor worth training was left out because it did not fit.
        limited_by = tm.limited_by(masks[rho], importance, rho)
        predicted = tm.predicted_ratio(masks[rho])
        results.append({"rho": rho, "measured_ratio": sel_ms / full_ms,
                        "predicted_ratio": predicted, "budget_used": predicted / rho,
                        "selected": len(selections[rho]), "step_ms": sel_ms,
                        "limited_by": limited_by})

    # The closed loop, as a run at each rho applies it: the elastic runtime (elastic/runtime.py,
    # the one every training loop drives) asks for its selection's steps and full steps among
    # them, measures, corrects the time model and re-solves, until it keeps a selection.
    from elastictrainer.elastic import ElasticRuntime

    def closed_loop(rho, feedback=True, max_steps=400):
        rt = ElasticRuntime(tm, rho, feedback=feedback, steps_per_epoch=max_steps,
                            total_steps=max_steps, economy=False, log=lambda *_: None)
        rt.importance_ready(0, importance, 0.0)
        for step in range(max_steps):
            kind = rt.step_kind()
            rt.step_done(step, kind, timed(full if kind == "full" else rt.selection, 1)[0])
            if not rt.measuring:
                break
        return rt

    # The noise of one such measurement on this machine: the same selection measured again and
    # again (feedback off: one round, judged, kept).  No controller can hold rho closer.
    mid = rhos[len(rhos) // 2]
    noise = [closed_loop(mid, feedback=False).records[-1].measured_ratio
             for _ in range(noise_trials)]
    bar.update(1)

    for res in results:
        rt = closed_loop(res["rho"])
        last = rt.records[-1]
        res.update(closed_loop_ratio=last.measured_ratio, corrections=len(rt.corrections),
                   closed_loop_history=[(sum(r.mask), r.predicted_ratio, r.measured_ratio)
                                        for r in rt.records],
                   closed_loop_selected=sum(last.mask),
                   closed_loop_predicted=last.predicted_ratio)
        bar.update(1)
    # one controller fed every open-loop measurement: the time model after correction
    from elastictrainer.elastic import RhoController

    pooled = RhoController(tm, rhos[0])
    for res in results:
        pooled.correct(masks[res["rho"]], res["measured_ratio"])

    # the same random selections judged by the time model without the calibration's fixed cost,
    # and without calibration at all: does the intercept lower the error?
    variants = _time_model_variants(table)
    # ... and by the model the closed loop fitted from the rho selections ("corrected")
    judges = dict(variants, corrected=pooled.model)
    errors = {k: [] for k in judges}
    trainer.steps.maxsize = 4
    for i in range(random_selections):
        # random depth, random density above it: the kinds of selections the DP makes
        order = tm.order
        depth = int(rng.integers(1, n + 1))
        mask = np.zeros(n, bool)
        chosen = order[:depth][rng.random(depth) < rng.uniform(0.2, 1.0)]
        mask[chosen] = True
        mask[order[depth - 1]] = True
        sel = tm.selection(mask)[0]
        timed(sel, 1)
        # in units of today's full step, so machine-wide drift since profiling cancels out
        ratio = statistics.median(timed(sel, steps)) * 1e3 / full_ms
        for k, judge in judges.items():
            errors[k].append(abs(judge.predicted_ratio(mask) - ratio) / ratio)
        bar.update(1)

    mape = {k: float(np.mean(v)) if v else None for k, v in errors.items()}

    trainer.steps.maxsize = 8
    rss = []
    for i in range(reselections):
        imp = rng.uniform(-0.2, 1.0, n)
        rho = float(rng.uniform(min(rhos), max(rhos)))
        mask = tm.select(imp, rho)
        sel = tm.selection(mask)[0]
        trainer.step_for(sel)(x, y)[0].numpy()
        rss.append(rss_mb())
        bar.update(1)
    bar.close()
    growth = (rss[-1] - rss[min(9, len(rss) - 1)]) / max(len(rss) - 10, 1) if len(rss) > 10 else 0.0
    return {
        "model": str(model_name), "input_size": input_size, "batch_size": batch_size,
        "num_tensors": n, "importance": importance_kind, "timing_table": path,
        "full_step_ms": full_ms, "profiled_full_step_ms": tm.t_full,
        "results": results, "time_model_mape": mape["table"],
        "time_model_mape_corrected": mape["corrected"],
        "time_model_mape_by_model": {k: mape[k] for k in variants},
        "correction": pooled.state(),
        "noise": {"rho": mid, "ratios": noise,
                  "cv": float(np.std(noise) / np.mean(noise)) if len(noise) > 1 else None},
        "dp_ms": dp_ms, "rss_mb": rss, "rss_growth_mb_per_reselection": growth,
        "rss_after_first_mb": rss[0] if rss else None, "rss_after_last_mb": rss[-1] if rss else None,
        "step_cache_traces": trainer.steps.traces, "repeats": repeats, "steps": steps,
    }


def plot(result, path):
    from elastictrainer import plotting

    plt = plotting.pyplot()

    rhos = [r["rho"] for r in result["results"]]
    fig, ax = plt.subplots(figsize=(4.6, 4))
    lo, hi = min(rhos) - 0.1, max(rhos) + 0.1
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="requested = achieved")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9", label="±10%")
    ax.plot(rhos, [r["measured_ratio"] for r in result["results"]], "o-",
            label="measured, open loop (the table alone)")
    if all("closed_loop_ratio" in r for r in result["results"]):
        ax.plot(rhos, [r["closed_loop_ratio"] for r in result["results"]], "^-", color="C4",
                label="measured, closed loop (as a run)")
    bound = [r for r in result["results"] if r.get("limited_by") in ("importance", "depth")]
    if bound:
        ax.plot([r["rho"] for r in bound], [r["measured_ratio"] for r in bound], "o", ms=11,
                mfc="none", mec="C3", label="budget left unspent on purpose\n"
                "(nothing worth training within reach)")
    ax.plot(rhos, [r["predicted_ratio"] for r in result["results"]], "s:", label="time model")
    ax.set_xlabel("requested rho (elastic / full step time)")
    ax.set_ylabel("achieved step-time ratio")
    ax.set_title(f"{result['model']}, input {result['input_size']}, batch {result['batch_size']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plotting.save_figure(fig, os.path.splitext(path)[0])


def main(argv=None):
    args = build_parser().parse_args(argv)
    result = run_benchmark(args.model_name, args.input_size, args.batch_size, args.num_classes, args.rhos,
                           args.repeats, args.steps, args.random_selections, args.reselections,
                           args.timing_table, args.seed, progress=not args.quiet,
                           importance=args.importance, noise_trials=args.noise_trials)
    stem = os.path.splitext(os.path.basename(args.model_name))[0]
    out = args.out or os.path.join(
        "figures", f"bench_{stem}_i{result['input_size']}_b{args.batch_size}_{args.importance}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    from elastictrainer import runlog
    runlog.write_json(out, result)
    plot(result, args.figure or os.path.splitext(out)[0] + ".png")
    print(f"{result['model']} input {result['input_size']} batch {result['batch_size']}: "
          f"full step {result['full_step_ms']:.1f} ms (profiled {result['profiled_full_step_ms']:.1f})")
    print(f"{'rho':>5} {'measured':>9} {'predicted':>9} {'|meas/rho-1|':>12} {'|meas/pred-1|':>13} "
          f"{'selected':>8}  {'limited by':<13} {'closed loop':>11} {'corr.':>5}")
    for r in result["results"]:
        print(f"{r['rho']:>5.2f} {r['measured_ratio']:>9.3f} {r['predicted_ratio']:>9.3f} "
              f"{abs(r['measured_ratio'] / r['rho'] - 1):>12.3f} "
              f"{abs(r['measured_ratio'] / r['predicted_ratio'] - 1):>13.3f} "
              f"{r['selected']:>5}/{result['num_tensors']}  {r['limited_by']:<13} "
              f"{r['closed_loop_ratio']:>11.3f} {r['corrections']:>5}")
    mape, after = result["time_model_mape"], result["time_model_mape_corrected"]
    print(f"time model MAPE on {args.random_selections} random selections: {mape:.3f} as "
          f"profiled, {after:.3f} corrected by the rho measurements" if mape is not None
          else "time model MAPE: n/a")
    by = result["time_model_mape_by_model"]
    if all(v is not None for v in by.values()):
        print("  the same selections, by time model: " + ", ".join(
            f"{k} {v:.3f}" for k, v in by.items()))
    nz = result["noise"]
    if nz["cv"] is not None:
        print(f"one run's measurement of the rho {nz['rho']:g} selection, taken {len(nz['ratios'])} "
              f"times: {min(nz['ratios']):.3f} to {max(nz['ratios']):.3f} (coefficient of "
              f"variation {nz['cv']:.3f}): no closed loop holds rho closer than its measurements")
    print(f"DP solve: {result['dp_ms']:.2f} ms; RSS growth {result['rss_growth_mb_per_reselection']:.2f} MB "
          f"per re-selection ({result['rss_after_first_mb']:.0f} -> {result['rss_after_last_mb']:.0f} MB "
          f"over {args.reselections}); written {out}")
    return 0


if __name__ == "__main__":
    errors.run_cli(main)
