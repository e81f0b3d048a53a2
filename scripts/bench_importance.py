"""Measure the importance estimators (paper eq. 4-6 and alternatives) against real loss drops.

Usage (from the repo root; figures/bench_importance.json came from the second line, 25 min on
2 cores):
    python scripts/bench_importance.py [--settings sgd:1e-4,adam:1e-3,adam:3e-3]
        [--states random,pretrained,elastic] [--seeds 0,1] [--out figures/bench_importance.json]
    python scripts/bench_importance.py --seeds 0,1

For each optimizer setting and training state, every tensor k is trained alone from that state
(weights and optimizer state as training left them) and its loss drop on held-out data is
measured: `drop1`, one optimizer step (mean over the probe batches), and `dropN`, --train_steps
steps on training batches ("the loss drop its training brings").  Each estimator is computed on
--draws independent sets of probe batches and compared with both by Spearman rank correlation
over the tensors; `pos` counts tensors with a positive estimate (mean over draws).

States: random (fresh weights, fresh optimizer: an elastic run's first selection); pretrained
(weights of --pretrain_steps of full Adam 1e-3 training, then --warm_steps of full training with
the setting's optimizer: a stand-in for fine-tuning a pretrained model); elastic (fresh weights,
the output-side half of the tensors trained --warm_steps with the setting's optimizer, the rest
never: what an elastic run reaches at its second selection).  Adam runs with Keras' global bias
correction (adam) and with the per-tensor one (adam+pt, train_steps.py).

Estimators (importance.py's probe: g0 = gradient at w, dw = optimizer step, g1 = gradient at
w + dw): paper = -g1.dw (eq. 4-6, importance `taylor_paper`), first = -g0.dw, mid = -(g0 + g1)/2.dw
(the trapezoid rule, exact for a quadratic loss); "_fresh": dw from zeroed optimizer slots
(first_fresh is importance `taylor`, what elastic_training uses); suffix "x4": summed over 4
probe batches instead of 1.  The final table: each estimator's rank correlation with dropN (and
its count of positive estimates), mean over seeds.
"""
import json
import os
import platform
import sys
import time

import numpy as np

from elastictrainer.config import ArgumentParser, comma_list
from elastictrainer.experiments.importance_report import markdown, spearman


def summarize(runs):
    """Mean over seeds of each estimator's rank correlation with dropN, per setting and state,
    printed as one table."""
    keys = sorted({(r["setting"], r["state"]) for r in runs}, key=lambda k: (k[0], k[1]))
    names = list(runs[0]["estimators"])
    table = {}
    for name in names:
        for key in keys:
            sel = [r["estimators"][name] for r in runs if (r["setting"], r["state"]) == key]
            table.setdefault(name, {})[" ".join(key)] = {
                "rho_dropN": float(np.mean([s["rho_dropN"] for s in sel])),
                "pos": float(np.mean([s["pos"] for s in sel]))}
    print("\nrank correlation with dropN (positive estimates), mean over seeds")
    print(" " * 14 + "".join(f"{k[0][:10]:>11s}" for k in keys))
    print(" " * 14 + "".join(f"{k[1][:10]:>11s}" for k in keys))
    for name in names:
        cells = [table[name][" ".join(k)] for k in keys]
        print(f"{name:14s}" + "".join(f"{c['rho_dropN']:+6.2f}({c['pos']:2.0f})" for c in cells))
    return table


def _index(tr, k):
    """Position of trainable tensor k in model.weights."""
    ref = tr.variables[k].ref()
    return next(i for i, v in enumerate(tr.model.weights) if v.ref() == ref)


def build_parser():
    ap = ArgumentParser(prog="bench_importance.py", description=__doc__.splitlines()[0])
    ap.add_argument("--model_name", default="smallcnn", help="built-in model to measure")
    ap.add_argument("--input_size", type=int, default=32, help="image side in pixels")
    ap.add_argument("--batch_size", type=int, default=8, help="training and probe batch size")
    ap.add_argument("--settings", default="sgd:1e-4,adam:1e-3,adam:3e-3",
                    type=comma_list(str, "optimizer:lr pairs"),
                    help="optimizer:learning_rate pairs (optimizers.make_optimizer's optimizers)")
    ap.add_argument("--states", default="random,pretrained,elastic",
                    type=comma_list(str, "states"), help="training states (see above)")
    ap.add_argument("--pretrain_steps", type=int, default=256,
                    help="full Adam 1e-3 steps that make the 'pretrained' weights")
    ap.add_argument("--warm_steps", type=int, default=256,
                    help="steps of the setting's optimizer before measuring (pretrained, elastic)")
    ap.add_argument("--train_steps", type=int, default=32, help="N of dropN")
    ap.add_argument("--draws", type=int, default=3, help="independent probe draws")
    ap.add_argument("--pool", type=int, default=640, help="training batches drawn from")
    ap.add_argument("--held_out", type=int, default=512, help="held-out examples")
    ap.add_argument("--seeds", default="0", type=comma_list(int, "integers"),
                    help="model and data seeds (each repeats every measurement)")
    ap.add_argument("--out", default="figures/bench_importance.json",
                    help="JSON file for the results ('' for none)")
    ap.add_argument("--configs", default=None, type=comma_list(str, "configurations"),
                    help="measure these real fine-tunes instead (experiments/importance_truth.py: "
                         "domain_shift_nested, domain_shift_fit, efficientnet_imagenet, "
                         "efficientnet_textures): every "
                         "tensor's held-out loss drop from --train_steps SGD steps alone, "
                         "against each estimator; writes --out's .json and .md (default "
                         "figures/bench_importance_truth)")
    ap.add_argument("--probes", type=int, default=8,
                    help="with --configs: probe batches each estimator is summed over")
    return ap


def main_configs(args):
    """The --configs measurement: one record per configuration and seed, resumable (a finished
    one is read back from --out's .json), and its table in --out's .md."""
    from elastictrainer.experiments import importance_truth as it
    from elastictrainer.machine import machine_info, machine_text

    out = args.out if args.out != "figures/bench_importance.json" else (
        "figures/bench_importance_truth")
    path = out + ".json"
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            done = {(r["config"], r["seed"]): r for r in json.load(f)["runs"]}
    for name in args.configs:
        for seed in args.seeds:
            if (name, seed) in done:
                continue
            print(f"--- {name} seed {seed}", flush=True)
            done[(name, seed)] = it.measure(name, seed, steps=args.train_steps,
                                            probes=args.probes)
            runs = sorted(done.values(), key=lambda r: (r["config"], r["seed"]))
            with open(path, "w") as f:  # after every run: a killed grid resumes
                json.dump({"machine": machine_text(machine_info()),
                           "date": time.strftime("%Y-%m-%d"),
                           "command": "python scripts/bench_importance.py " + " ".join(
                               sys.argv[1:]),
                           "runs": runs}, f, indent=1)
    with open(path) as f:
        data = json.load(f)
    text = markdown(data)
    from elastictrainer.experiments import perfdoc

    perfdoc.write_benchmark(out, data, text)  # the .md, and its block of docs/performance.md
    print(text)


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.configs:
        from elastictrainer.experiments.importance_truth import CONFIGS

        unknown = [name for name in args.configs if name not in CONFIGS]
        if unknown:
            ap.error(f"--configs {unknown[0]}: not one of {', '.join(CONFIGS)}")
        return main_configs(args)

    from elastictrainer.flavors import tf_setup  # noqa: F401
    import tensorflow as tf
    import tf_keras as keras

    from elastictrainer.flavors import optimizers
    from elastictrainer.method import importance
    from elastictrainer.method import schemes
    from elastictrainer.data.synthetic import synthetic_dataset
    from elastictrainer.models.build import build_sized
    from elastictrainer.method.roles import tensor_roles
    from elastictrainer.train.compiled import CompiledSteps

    bundle = synthetic_dataset(input_size=args.input_size, batch_size=args.batch_size,
                               seed=0, num_test=args.held_out)
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in bundle.test])
    hx, hy = np.concatenate(xs), np.concatenate(ys)
    held = [(tf.constant(hx[i:i + 128]), tf.constant(hy[i:i + 128]))
            for i in range(0, len(hx), 128)]
    # Training batches drawn once: a new iterator of the dataset reshuffles.
    it = iter(bundle.train.repeat())
    pool = [tuple(t.numpy() for t in next(it)) for _ in range(args.pool)]
    stream = None

    def restart(seed):
        """The same batches and random draws (dropout, augmentation) from here on, for every
        setting: adam and adam+pt then reach the same states, and differ only where the bias
        correction does."""
        nonlocal stream
        order = np.random.default_rng(seed).permutation(len(pool))
        stream = (tuple(tf.constant(a) for a in pool[i]) for r in range(10**6) for i in order)
        keras.utils.set_random_seed(seed)

    def batches(n):
        return [next(stream) for _ in range(n)]

    def make_trainer(opt, lr, per_tensor, seed):
        keras.utils.set_random_seed(seed)
        model, _, _ = build_sized(args.model_name, args.input_size, bundle.num_classes, "none")
        optimizer = optimizers.make_optimizer(opt, lr, 5e-4, 12 * 64,
                                          per_tensor_bias_correction=per_tensor)
        tr = CompiledSteps(model, optimizer, schemes.SCHEMES["full_training"], tensor_roles(model))
        tr.steps.maxsize = 64  # one step per single tensor, kept
        return tr

    def held_loss(tr):
        total = sum(float(tr.eval_fn(x, y)[0]) for x, y in held)
        return total / len(hx)

    def snapshot(tr):
        return ([v.numpy() for v in tr.model.weights], [v.numpy() for v in tr.optimizer.variables])

    def restore(tr, snap):
        for v, w in zip(tr.model.weights, snap[0]):
            v.assign(w)
        for v, w in zip(tr.optimizer.variables, snap[1]):
            v.assign(w)

    def measure(tr, label, opt, lr, per_tensor, state, seed, n):
        t0 = time.perf_counter()
        start = pretrained_weights if state == "pretrained" else random_weights
        restore(tr, (start, [np.zeros(v.shape, v.dtype.as_numpy_dtype)
                             for v in tr.optimizer.variables]))
        restart(seed + 1)
        warm = {"random": (), "pretrained": tuple(range(n)),
                "elastic": tuple(range(n // 2, n))}[state]
        if warm:
            step = tr.step_for(warm)
            for x, y in batches(args.warm_steps):
                step(x, y)
        snap = snapshot(tr)
        loss0 = held_loss(tr)
        step_batches = batches(4)
        train_batches = batches(args.train_steps)
        drop1, drop_n, step_over_lr = np.zeros(n), np.zeros(n), np.zeros(n)
        for k in range(n):
            step = tr.step_for((k,))
            for i, (x, y) in enumerate(step_batches):
                restore(tr, snap)
                step(x, y)
                if i == 0:  # mean |dw| / lr of the tensor's first step from this state
                    step_over_lr[k] = float(np.mean(np.abs(tr.variables[k].numpy() -
                                                           snap[0][_index(tr, k)]))) / lr
                drop1[k] += (loss0 - held_loss(tr)) / len(step_batches)
            restore(tr, snap)
            for x, y in train_batches:
                step(x, y)
            drop_n[k] = loss0 - held_loss(tr)
        restore(tr, snap)
        est = {}
        for _ in range(args.draws):
            probes = batches(4)
            for fresh, suffix in ((False, ""), (True, "_fresh")):
                terms = [importance.probe_terms(tr, [b], fresh_state=fresh) for b in probes]
                for nb in (1, 4):
                    first = sum(t[0] for t in terms[:nb])
                    after = sum(t[1] for t in terms[:nb])
                    tag = suffix + ("x4" if nb == 4 else "")
                    for name, v in (("paper", after), ("first", first),
                                    ("mid", (first + after) / 2)):
                        est.setdefault(name + tag, []).append(v)
        rows = {}
        for name, vals in est.items():
            rows[name] = {
                "rho_drop1": float(np.mean([spearman(v, drop1) for v in vals])),
                "rho_dropN": float(np.mean([spearman(v, drop_n) for v in vals])),
                "pos": float(np.mean([np.sum(np.asarray(v) > 0) for v in vals])),
            }
        run = {"setting": label, "optimizer": opt, "lr": lr, "per_tensor": per_tensor,
               "state": state, "seed": seed, "loss": loss0, "drop1": drop1.tolist(),
               "dropN": drop_n.tolist(), "step_over_lr": step_over_lr.tolist(),
               "pos_drop1": int(np.sum(drop1 > 0)), "pos_dropN": int(np.sum(drop_n > 0)),
               "rho_drop1_dropN": spearman(drop1, drop_n), "estimators": rows,
               "seconds": time.perf_counter() - t0}
        untrained = list(range(n // 2)) if state == "elastic" else list(range(n))
        print(f"\nseed {seed} {label:12s} {state:10s} held-out loss {loss0:.4f}; tensors whose "
              f"training lowers it: 1 step {run['pos_drop1']}/{n}, "
              f"{args.train_steps} steps {run['pos_dropN']}/{n} "
              f"(rank corr. of the two {run['rho_drop1_dropN']:+.2f}); "
              f"{'never-trained' if state == 'elastic' else 'all'} tensors: first step "
              f"{np.mean(step_over_lr[untrained]):.2f} x lr per element, summed drop after "
              f"{args.train_steps} steps {np.sum(drop_n[untrained]):+.4f} "
              f"({run['seconds']:.0f} s)")
        print(f"  {'estimator':14s} {'rho(drop1)':>10s} {'rho(dropN)':>10s} {'pos':>5s}")
        for name, r in rows.items():
            print(f"  {name:14s} {r['rho_drop1']:+10.2f} {r['rho_dropN']:+10.2f} "
                  f"{r['pos']:5.1f}", flush=True)
        return run

    runs = []
    for seed in args.seeds:
        # Pretrained weights: full training with Adam 1e-3 from the same random weights.
        t0 = time.perf_counter()
        pre = make_trainer("adam", 1e-3, True, seed)
        random_weights = [v.numpy() for v in pre.model.weights]
        n = len(pre.variables)
        names = [v.name for v in pre.variables]
        if "pretrained" in args.states:
            restart(seed + 100)
            step = pre.step_for(tuple(range(n)))
            for x, y in batches(args.pretrain_steps):
                step(x, y)
        pretrained_weights = [v.numpy() for v in pre.model.weights]
        pre_loss = held_loss(pre)
        print(f"seed {seed}: pretrained held-out loss {pre_loss:.4f} after "
              f"{args.pretrain_steps} Adam 1e-3 steps ({time.perf_counter() - t0:.0f} s)",
              flush=True)
        del pre
        for setting in args.settings:
            opt, lr = setting.split(":")
            lr = float(lr)
            for per_tensor in ([True, False] if opt == "adam" else [True]):
                tr = make_trainer(opt, lr, per_tensor, seed)
                label = f"{opt}{'+pt' if opt == 'adam' and per_tensor else ''} {lr:g}"
                for state in args.states:
                    runs.append(measure(tr, label, opt, lr, per_tensor, state, seed, n))
                del tr

    summary = summarize(runs)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "tensor_names": names,
                       "platform": platform.platform(), "summary": summary,
                       "runs": runs}, f, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
