"""The time-to-accuracy benchmark's model.fit configurations (scripts/bench_time_to_accuracy.py):
which pretrained task of experiments/fit_task.py each fine-tunes, for how many epochs, and with
which schemes (plain fit on all weights, the last stage and head by hand, ElasticCallback
runs); one seed's runs, in one process after a warm-up fit, or read back from the curves file a
finished seed left (a fit leaves no run directory to read back).  No TensorFlow until a seed
runs."""
import dataclasses
import json
import os

from elastictrainer import runlog
from elastictrainer.errors import UserError
from elastictrainer.experiments import fit_task, time_to_accuracy as tta
from elastictrainer.experiments.cli_configs import auto_again


@dataclasses.dataclass(frozen=True)
class FitSetup:
    """A model.fit configuration: its task (the name of a fit_task.FitTask), its epochs, and
    its ElasticCallback runs: None for one per --rhos and per --shares with --fit_bn_mode,
    else its own (scheme, ElasticCallback settings) pairs."""
    task: str
    epochs: int
    elastic: tuple = None


FIT_CONFIGS = {
    "keras3_fit": FitSetup("CNN", 12),
    # a user's case: the callback as they called it, every other setting at its default
    "domain_shift_fit": FitSetup("SHIFTED_MOBILENETV2", 8, elastic=(
        ("ElasticCallback rho auto", {"rho": "auto"}),
        ("ElasticCallback rho auto, trial check", {"rho": "auto", "trial_check": True}),
        ("ElasticCallback rho 0.3, bn_mode inference", {"rho": 0.3, "bn_mode": "inference"}))),
    # the transfer-learning guide's case: the application nested in the user's model, at its
    # own BatchNorm momentum, re-selected every 2 epochs as a user sets it; 16 epochs, since
    # at 8 plain fit's accuracy still moved 11 points between its last two (its BatchNorm
    # averages, 0.999 a step, trailing the weights)
    "domain_shift_nested": FitSetup("SHIFTED_NESTED_MOBILENETV2", 16, elastic=(
        ("ElasticCallback rho auto", {"rho": "auto", "interval": 2}),
        ("ElasticCallback rho auto, curvature",
         {"rho": "auto", "interval": 2, "train_type": "elastic_training_curvature"}),
        ("ElasticCallback rho auto, trial check",
         {"rho": "auto", "interval": 2, "trial_check": True}),
        ("ElasticCallback rho 0.4", {"rho": 0.4, "interval": 2}))),
}


def fit_variants(name, args):
    """[(scheme, frozen_below, ElasticCallback settings or None)] of configuration `name`:
    plain fit on all weights, the last stage and head trained by hand, then its
    ElasticCallback runs."""
    setup = FIT_CONFIGS[name]
    task = getattr(fit_task, setup.task)
    variants = [("plain_fit", None, None), ("hand_frozen", task.last_stage, None)]
    rate = [(f"ElasticCallback rho auto, {objective}", None,
             {"rho": "auto", "rho_objective": objective})
            for objective in ("rate", "gain") if getattr(args, objective, False)]
    if setup.elastic is not None:
        variants += [(scheme, None, dict(settings)) for scheme, settings in setup.elastic] + rate
    else:
        variants += [(f"ElasticCallback rho {rho:g}", None,
                      {"rho": rho, "bn_mode": args.fit_bn_mode}) for rho in args.rhos]
        tolerance = getattr(args, "tolerance", None)
        if tolerance:
            variants += [(f"ElasticCallback rho {rho:g}, tolerance {tolerance:g}", None,
                          {"rho": rho, "rho_tolerance": tolerance, "bn_mode": args.fit_bn_mode})
                         for rho in args.rhos]
        variants += [(f"ElasticCallback rho auto, share {share:g}", None,
                      {"rho": "auto", "rho_share": share, "bn_mode": args.fit_bn_mode})
                     for share in args.shares]
        variants += [(s, f, dict(c, bn_mode=args.fit_bn_mode)) for s, f, c in rate]
    variants += auto_again(args, variants, lambda c: c is not None and c.get("rho") == "auto"
                           and not c.get("trial_check"))
    if getattr(args, "uncached_too", False):  # each ElasticCallback again, the cache off
        variants += [(f"{s}, uncached", f, dict(c, cache_frozen_prefix=False))
                     for s, f, c in variants if c is not None]
    return variants


def fit_settings(name, args):
    """What configuration `name`'s runs were given: its task's sizes, its domain shift (None:
    none) and its epochs."""
    task = getattr(fit_task, FIT_CONFIGS[name].task)
    shift = None if task.shift is None else dataclasses.asdict(task.shift)
    return {"task": FIT_CONFIGS[name].task, "input_size": task.size, "batch_size": task.batch,
            "num_train": task.train, "num_test": task.test, "source_images": task.source,
            "pretrain_epochs": task.pretrain_epochs, "last_stage": task.last_stage,
            "domain_shift": shift, "epochs": args.epochs or FIT_CONFIGS[name].epochs}


def fit_runs(name, seed, args, log):
    """({scheme: curve}, {}) of one seed of configuration `name` (fit_variants), in one process
    after a warm-up fit.  A seed whose every scheme has run is read from its curves file, not
    run again."""
    workdir = os.path.join(args.logdir, name)
    variants = fit_variants(name, args)
    record = os.path.join(workdir, f"curves_seed{seed}.json")
    done = _read_curves(record)
    if all(scheme in done for scheme, _, _ in variants):
        return {scheme: done[scheme] for scheme, _, _ in variants}, {}
    import keras

    setup = FIT_CONFIGS[name]
    task = fit_task.PretrainedTask(keras, workdir, seed, log=log,
                                   task=getattr(fit_task, setup.task))
    task.warm_up()
    curves = {}
    for scheme, frozen_below, settings in variants:
        log(f"--- {name} seed {seed}: {scheme}")
        model = task.fresh(frozen_below)
        clock = fit_task.epoch_clock(keras)
        callbacks = [clock]
        if settings is not None:
            # each elastic run pays for its first profiling, as the command-line
            # configurations' runs do
            callbacks.append(fit_task.first_run_callback(
                os.path.join(workdir, f"{slug(scheme)}_seed{seed}"),
                log=lambda m: log(f"    {m}"), **settings))
        try:
            model.fit(task.train, epochs=args.epochs or setup.epochs,
                      validation_data=task.test, verbose=0, callbacks=callbacks)
        except UserError as e:  # a rho below the forward floor, say: the row says so
            log(f"    refused: {e}")
            curves[scheme] = tta.Refused(str(e))
            continue
        curves[scheme] = clock.points
        log("    validation accuracy per epoch: "
            + ", ".join(f"{a:.1f}%" for _, a in clock.points))
    os.makedirs(workdir, exist_ok=True)
    runlog.write_json(record, curves)
    return curves, {}


def _read_curves(path):
    """{scheme: curve or Refused} from a curves file, or {} when there is none."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {name: tta.Refused(c) if isinstance(c, str) else [tuple(p) for p in c]
            for name, c in data.items()}


def slug(label):
    """A scheme's label as a file name."""
    return label.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
