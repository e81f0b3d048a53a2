"""The seeds a time-to-accuracy figures file already holds (scripts/bench_time_to_accuracy.py's
<out>.json), read back so that a grid continues from its committed figures instead of starting
over: a seed is taken from the file only when the file was measured on this machine (CPU, cores,
TensorFlow), with the same grid flags, the same settings of its configuration, and every scheme
this grid runs.  A run directory under --logdir is the other record a seed is read from
(finished_run): only when it finished with the settings the grid gives it, so that a grid run
again with other flags into the same --logdir never reads runs it did not ask for; the figures
file survives a fresh clone.

Each seed's costs (where its time went) are read too when the file holds them per seed; a file
that holds only their medians gives its seeds' curves alone, and the costs table then says over
which seeds its medians run.  No TensorFlow."""
import dataclasses
import json
import os

from elastictrainer import runlog
from elastictrainer.runlog import as_json
from elastictrainer.errors import UserError
from elastictrainer.experiments import time_to_accuracy as tta
from elastictrainer.method.schemes import SCHEMES

# the flags that decide what a grid runs; a seed is read back only under the same ones
GRID_FLAGS = ("rhos", "shares", "rate", "gain", "tolerance", "elastic_only", "epochs",
              "fit_bn_mode", "bn_mode")


class OtherSettings(UserError):
    """A run directory holds a finished run of other settings than the grid gives it."""


# Config fields that say where a run writes and how it shows itself, not what it trains: a
# finished run that differs from the grid's only in these is read back
NEUTRAL = ("logdir", "run_name", "save_model", "save_txt", "data_dir", "resume",
           "checkpoint_minutes", "keep_checkpoints", "progress", "energy", "timing_table",
           "profile_in")
# Config fields only an elastic scheme reads (when and what it selects): a finished run of
# another scheme is the same run whatever they say (full training beside --rho 0.4 or 0.5)
SELECTING = ("interval", "rho", "rho_share", "rho_objective", "rho_tolerance", "rho_feedback",
             "economy", "trial_check", "pace_check", "head_warmup", "probe_batches",
             "dp_resolution")
# what must match of the machine that measured a record
MACHINE_KEYS = ("cpu", "cores", "tensorflow")


def same_machine(theirs, machine):
    """Whether a record's machine (machine_info, or None) is `machine` for reading it back: the
    same CPU, cores and TensorFlow (a kernel update is the same machine)."""
    theirs = theirs or {}
    return all(theirs.get(key) == machine.get(key) for key in MACHINE_KEYS)


class Record:
    """The figures file at `path`, when it was made on `machine` with `flags`' grid
    ({flag: value}; a flag the file predates counts as `defaults`' value)."""

    def __init__(self, path, machine, flags, defaults):
        self.path = path
        self._configs = {}
        if not os.path.exists(path):
            return
        with open(path) as f:
            data = json.load(f)
        if not same_machine(data.get("machine"), machine):
            return
        args = data.get("args") or {}
        if any(as_json(args.get(flag, defaults.get(flag))) != as_json(flags.get(flag))
               for flag in GRID_FLAGS):
            return
        for name, config in (data.get("configs") or {}).items():
            seeds = args.get("seeds") if name == "smallcnn" else args.get("other_seeds")
            if seeds and len(seeds) == config.get("runs"):
                self._configs[name] = (list(seeds), config)

    def seed(self, name, seed, schemes, settings):
        """(curves, costs) of `seed` of configuration `name` as recorded ({scheme: curve},
        {scheme: costs} or None when the file holds only median costs), when the record has
        that seed under these `settings` with every one of `schemes`; else None."""
        if name not in self._configs:
            return None
        seeds, config = self._configs[name]
        if seed not in seeds or as_json(config.get("settings")) != as_json(settings):
            return None
        curves = config.get("curves") or {}
        if any(scheme not in curves for scheme in schemes):
            return None
        i = seeds.index(seed)
        mine = {scheme: _curve(curves[scheme][i]) for scheme in schemes}
        per_seed = config.get("costs_per_seed")
        costs = per_seed[i] if per_seed and len(per_seed) == len(seeds) else None
        return mine, costs


# what a grid's user does about a finished run of other settings
NEW_LOGDIR = "pass another --logdir, or remove that run directory to train it again"


def finished_run(cfg, remedy=NEW_LOGDIR):
    """The summary of the run `cfg` names (cfg.logdir/cfg.run_name) when it finished with cfg's
    settings; None when there is none to read (not run yet, stopped or failed: it trains).  A
    finished run of other settings is refused (OtherSettings) with one line naming the first
    that differs and `remedy`: a field its config.json predates counts as that field's
    default; NEUTRAL fields, SELECTING ones for a scheme that does not select, and a class
    count cfg leaves to the dataset, are not compared."""
    run_dir = os.path.join(cfg.logdir, cfg.run_name)
    summary = runlog.finished_summary(run_dir)
    if summary is None:
        return None
    try:
        saved = runlog.read_config(run_dir)
    except (OSError, ValueError):
        raise OtherSettings(
            f"{run_dir} holds a finished run whose {runlog.CONFIG_FILE} is missing or "
            f"unreadable, so its settings are unknown: {remedy}") from None
    scheme = SCHEMES.get(cfg.train_type)
    skip = NEUTRAL + (SELECTING if scheme is not None and not scheme.elastic else ())
    differs = cfg.first_difference(saved, [f.name for f in dataclasses.fields(cfg)
                                           if f.name not in skip])
    if differs:
        name, old, new = differs
        raise OtherSettings(f"{run_dir} holds a finished run with --{name} {old}, not {new}: "
                            f"{remedy}")
    return summary


def _curve(recorded):
    """A recorded curve: its points, or the reason a refused run gave."""
    if isinstance(recorded, str):
        return tta.Refused(recorded)
    return [tuple(point) for point in recorded]


def summarize_costs(per_seed_costs, reference_curves):
    """tta.summarize_costs over the seeds whose costs are known (per_seed_costs: {scheme:
    costs} per seed, None for a seed read back without them), of the schemes each of them
    ran, and those seeds' indices; ({}, []) when none is known."""
    known = [i for i, costs in enumerate(per_seed_costs) if costs is not None]
    if not known:
        return {}, []
    first = per_seed_costs[known[0]]
    costs = {scheme: [per_seed_costs[i][scheme] for i in known] for scheme in first
             if all(scheme in per_seed_costs[i] for i in known)}
    if not costs:
        return {}, known
    return tta.summarize_costs(costs, [reference_curves[i] for i in known]), known
