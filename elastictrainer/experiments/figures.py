"""The one driver behind scripts/run_figure*.sh: profile, train every run of a paper figure, plot.

    elastictrainer figure fig17            # the paper's protocol (hours to days on a device)
    elastictrainer figure fig17 --ego      # ElasticTrainer runs only
    elastictrainer figure fig17 --smoke    # same pipeline, synthetic data, small model, minutes
    elastictrainer figure fig17 --offline  # the paper's regime offline (ImageNet EfficientNet-
                                           # Lite0 on textures), beside the paper's numbers
    elastictrainer figure fig17 --dry_run  # list the commands
    elastictrainer figure fig17 --ray HOST:6379 --ray_resources pi4=1   # on a cluster of boards

A figure is data (FIGURES below): models x datasets x (ElasticTrainer at each rho + baselines),
and the plots drawn from the run directories.  Runs are `elastictrainer train ...` processes
with fixed run names under --logdir; a run whose summary.json says "finished" is not run again,
so an interrupted script picks up where it stopped, and the run it was in continues from its
last checkpoint (checkpoint.py; same run name, same settings).  Figures
are drawn by `elastictrainer plot` from summary.json and the TensorBoard events, and written as
PNG + PDF under --figdir.  Paths default to logs/, figures/ and profiles/ in the current
directory.

Runs go one after the other in this process's terminal, or with --ray as Ray tasks on a cluster
(cluster.py): the same commands, run names and resume rule; each run's directory comes back
into --logdir here, and the figures are drawn here from it.
"""
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from elastictrainer import runlog
from elastictrainer.errors import RunError, UserError
from elastictrainer.data import NUM_CLASSES
from elastictrainer.profiler.table import default_table_path, default_trace_dir, load_table
from elastictrainer.method.schemes import BASELINES
from elastictrainer.method.time_model import TimeModel
from elastictrainer.experiments.protocols import (  # noqa: F401 (figures.PAPER, ...)
    IMAGENET_MODEL, OFFLINE, OFFLINE_DATASET, OFFLINE_MODEL, PAPER, SMOKE, Protocol,
    offline_regime)

PAPER_DATASETS = ("caltech_birds2011", "oxford_iiit_pet", "stanford_dogs")


@dataclass(frozen=True)
class Figure:
    """What a paper figure trains and draws."""
    title: str
    models: tuple
    datasets: tuple
    rhos: tuple                 # ElasticTrainer's requested step-time ratios
    baselines: tuple
    plots: tuple                # of (kind, output suffix): curves | bars | selection | energy | profile
    selection_rho: float = None  # the elastic run whose selection heat map is drawn
    smoke_models: tuple = ("smallcnn",)
    # smallcnn's forward pass (with the fixed cost of a partial step) takes 0.40 of its step at
    # 64 px, batch 32, on 2 AVX-512 cores (0.31 on an older Intel machine), and a rho at or
    # below that floor is skipped: the smoke figures ask 0.5 and up, so that every machine runs
    # them all; the paper's 0.35 and 0.4 are left out.
    smoke_rhos: tuple = (0.5,)
    # --offline: the paper's regime on backbones that need no download, each on its own target
    # and protocol (protocols.offline_regime: ImageNet EfficientNet-Lite0 on synthetic_textures,
    # the backbones `--weights synthetic` pretrains on the synthetic data), at the paper's rhos
    # unless given here
    offline_models: tuple = (OFFLINE_MODEL,)
    offline_rhos: tuple = None


FIGURES = {
    "fig15": Figure("Fig. 15: accuracy and loss over wall-clock time, Jetson TX2 protocol",
                    ("resnet50",), PAPER_DATASETS, (0.5,), BASELINES[:3],
                    (("curves", ""), ("bars", "_bars"), ("profile", "_profile"))),
    "fig16": Figure("Fig. 16: accuracy and loss over wall-clock time, Raspberry Pi 4B protocol",
                    ("resnet50",), PAPER_DATASETS, (0.5,), BASELINES[:3],
                    (("curves", ""), ("bars", "_bars"), ("profile", "_profile"))),
    "fig17": Figure("Fig. 17: best accuracy and training time against rho and the baselines",
                    ("resnet50",), ("caltech_birds2011",), (0.35, 0.4, 0.5, 0.6, 0.7), BASELINES,
                    (("bars", ""), ("curves", "_curves"), ("selection", "_fig21"),
                     ("energy", "_fig23"), ("profile", "_profile")), selection_rho=0.5,
                    smoke_rhos=(0.5, 0.6, 0.7, 0.8), offline_models=(IMAGENET_MODEL,)),
    "fig19": Figure("Fig. 19: ElasticTrainer at rho 0.4 against the baselines on four models",
                    ("resnet50", "vgg16", "mobilenetv2", "vit"), ("caltech_birds2011",), (0.4,),
                    BASELINES, (("bars", ""), ("energy", "_fig23"), ("profile", "_profile")),
                    smoke_models=("smallcnn", "mobilenetv2"), smoke_rhos=(0.5,),
                    offline_models=(IMAGENET_MODEL, OFFLINE_MODEL, "smallcnn")),
}


@dataclass(frozen=True)
class Run:
    model: str
    dataset: str
    train_type: str
    rho: float = None

    @property
    def num_classes(self):
        return NUM_CLASSES[self.dataset]

    def name(self, seed):
        rho = f"_rho{self.rho:g}" if self.rho is not None else ""
        return f"{self.model}_{self.dataset}_{self.train_type}{rho}_seed{seed}"


def plan(figure, ego=False, smoke=False, offline=False):
    """The runs of a figure, ElasticTrainer first (an interrupted script has its main result)."""
    if smoke:
        models, datasets, rhos = figure.smoke_models, ("synthetic",), figure.smoke_rhos
    elif offline:
        models, rhos = figure.offline_models, figure.offline_rhos or figure.rhos
    else:
        models, datasets, rhos = figure.models, figure.datasets, figure.rhos
    runs = []
    for model in models:
        for dataset in ((offline_regime(model)[1],) if offline else datasets):
            runs += [Run(model, dataset, "elastic_training", rho) for rho in rhos]
            if not ego:
                runs += [Run(model, dataset, b) for b in figure.baselines]
    return runs


def table_path(run, protocol, profiles):
    return default_table_path(run.model, protocol.input_size, protocol.batch_size,
                              run.num_classes, protocol.flags(run.model)["optimizer"],
                              folder=profiles)


def figure_key(text):
    """FIGURES' key of a figure given as 'fig17', '17' or 'Fig17'; UserError listing the valid
    ones otherwise."""
    key = str(text).strip().lower()
    key = f"fig{key}" if key.isdigit() else key
    if key not in FIGURES:
        raise UserError(f"unknown figure {text!r}; valid: {', '.join(FIGURES)} (or their "
                        f"numbers: {', '.join(k[3:] for k in FIGURES)})")
    return key


class SerialRunner:
    """Runs a figure's commands one after the other as subprocesses of this one, their output in
    this terminal: the default, and what --dry_run prints."""
    device_kind = None

    def start(self, driver):
        pass

    def stop(self):
        pass

    def profile(self, driver, jobs):
        for run, path in jobs:
            argv = driver.argv(driver.profile_args(run, path, driver.logdir))
            if driver.call(argv, f"profile {run.model}") != 0:
                raise RunError(f"profiling {run.model} failed (see above)")

    def train(self, driver, jobs):
        """Yields (run, seed, status) as each run ends."""
        for run, seed in jobs:
            argv = driver.argv(driver.train_args(run, seed, driver.logdir, driver.profiles))
            rc = driver.call(argv, run.name(seed))
            yield run, seed, "finished" if rc == 0 else f"failed (exit {rc})"


class Driver:
    """One figure: the plan, the commands of its runs, the resume rule and the plots.  A runner
    (SerialRunner, or cluster.RayRunner) only decides where and when the commands run."""

    def __init__(self, key, ego=False, smoke=False, seeds=(0,), logdir=None, figdir=None,
                 profiles=None, data_dir=None, dry_run=False, python=None,
                 log=None, steps_per_epoch=None, runner=None, cache_frozen_prefix=False,
                 offline=False, num_test=None):
        key = figure_key(key)
        if smoke and offline:
            raise UserError("--smoke and --offline are two protocols: give one of them")
        self.key, self.figure, self.ego, self.smoke = key, FIGURES[key], ego, smoke
        self.offline = offline
        self._protocol = SMOKE if smoke else PAPER  # --offline: protocol_for(model)
        kind = "smoke" if smoke else "offline" if offline else None
        self.seeds = tuple(seeds)
        # runs that cache are not the paper's protocol: their folder and figures say so
        cache_tag = ("" if cache_frozen_prefix is False
                     else f"_cache{str(cache_frozen_prefix).lower()}")
        self.suffix = ("_ego" if ego else "") + cache_tag
        self.logdir = os.path.abspath(logdir or os.path.join(
            "logs", kind or "figures", key + cache_tag))
        self.figdir = os.path.abspath(figdir or os.path.join("figures", kind or ""))
        self.data_dir = os.path.abspath(data_dir) if data_dir else None
        self.dry_run = dry_run
        self.steps_per_epoch = steps_per_epoch  # a cap for quick checks of the pipeline
        self.num_test = num_test  # the same: fewer test images than the protocol's
        self.cache_frozen_prefix = cache_frozen_prefix
        # None: this Python here, and on a cluster node the Python that node's Ray runs
        self.python = python
        # flushed, so that our lines and the runs' own output stay in order in a log file
        self.log = log or (lambda line: print(line, flush=True))
        self.runs = plan(self.figure, ego, smoke, offline)
        runner = runner or SerialRunner()
        # a timing table is a device's: runs pinned to a kind of device get that kind's tables
        self.profiles = os.path.abspath(os.path.join(profiles or "profiles",
                                                     runner.device_kind or ""))
        self.runner = SerialRunner() if dry_run else runner

    def protocol_for(self, model):
        """The protocol a model's runs follow: --offline's is the model's own regime."""
        return offline_regime(model)[0] if self.offline else self._protocol

    # ----------------------------------------------------------------------------- commands
    def argv(self, args):
        """argv of an `elastictrainer ARGS` process in this Python (no PATH lookup needed)."""
        return [self.python or sys.executable, "-m", "elastictrainer"] + list(args)

    def command(self, sub):
        return self.argv([sub])

    def call(self, argv, what):
        """Run argv here, its output in this terminal; its exit code (Ctrl-C: KeyboardInterrupt)."""
        self.log("$ " + shlex.join(argv))  # quoted: a dry run's lines paste as they are
        if self.dry_run:
            return 0
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            # the run got the same Ctrl-C: let it finish its step and save (a second Ctrl-C
            # stops both at once)
            rc = proc.wait()
        if rc == 130:
            raise KeyboardInterrupt
        self.log(f"  {what}: exit {rc} after {time.perf_counter() - t0:.0f} s")
        return rc

    def profile_args(self, run, path, logdir):
        """`elastictrainer profile` arguments that write the run's timing table to `path` and
        its trace to <logdir>/<table name>_profile, where TensorBoard over the figure's runs
        finds it."""
        stem = os.path.splitext(os.path.basename(path))[0]
        return ["profile", "--model_name", run.model,
                "--optimizer", self.protocol_for(run.model).flags(run.model)["optimizer"],
                "--input_size", str(self.protocol_for(run.model).input_size),
                "--batch_size", str(self.protocol_for(run.model).batch_size),
                "--num_classes", str(run.num_classes), "--output", path,
                "--trace_dir", default_trace_dir(stem, logdir), "--figure", "", "--quiet"]

    def train_args(self, run, seed, logdir, profiles):
        """`elastictrainer train` arguments of one run, writing LOGDIR/<run name> with the
        timing table found in `profiles`."""
        flags = self.protocol_for(run.model).flags(run.model)
        if self.num_test:
            flags = dict(flags, num_test=self.num_test)
        args = ["train", "--model_name", run.model, "--dataset_name", run.dataset,
                "--train_type", run.train_type, "--num_classes", str(run.num_classes),
                "--seed", str(seed), "--logdir", logdir, "--run_name", run.name(seed),
                "--timing_table", table_path(run, self.protocol_for(run.model), profiles),
                "--quiet",
                "--cache_frozen_prefix", str(self.cache_frozen_prefix).lower()]
        if run.rho is not None:
            args += ["--rho", f"{run.rho:g}"]
        if self.data_dir:
            args += ["--data_dir", self.data_dir]
        if self.steps_per_epoch:
            args += ["--steps_per_epoch", str(self.steps_per_epoch)]
        for flag, value in flags.items():
            args += [f"--{flag}", f"{value:g}" if isinstance(value, float) else str(value)]
        return args

    def run_dir(self, run, seed):
        return os.path.join(self.logdir, run.name(seed))

    def rho_floor(self, run):
        """The forward pass's share of a step: no selection can go below it."""
        path = table_path(run, self.protocol_for(run.model), self.profiles)
        if self.dry_run and not os.path.exists(path):
            return 0.0
        return TimeModel(load_table(path)).rho_floor

    # ----------------------------------------------------------------------------- stages
    def profile_all(self):
        """{model_c<classes>: table path}: each model profiled once per head size (and per
        kind of device), a table that exists reused."""
        tables, missing = {}, []
        for run in self.runs:
            key = f"{run.model}_c{run.num_classes}"
            if key in tables:
                continue
            tables[key] = path = table_path(run, self.protocol_for(run.model), self.profiles)
            if os.path.exists(path):
                self.log(f"timing table {path} exists; reusing it")
            else:
                missing.append((run, path))
        if missing:
            self.runner.profile(self, missing)
        return tables

    def sort_runs(self, skipped):
        """(done, todo): the runs finished before, and those to run, in plan order; a rho at or
        below the model's forward floor goes to `skipped` with the reason."""
        done, todo = [], []
        for seed in self.seeds:
            for run in self.runs:
                floor = self.rho_floor(run) if run.rho is not None else 0.0
                if run.rho is not None and run.rho < floor + 0.01:
                    # a device where the forward pass alone takes more than rho of a step
                    skipped.append(f"{run.name(seed)}: rho {run.rho:g} is at or below "
                                   f"{run.model}'s forward floor {floor:.2f} at this input and "
                                   f"batch size; not run")
                    self.log(skipped[-1])
                elif runlog.run_status(self.run_dir(run, seed)) == "finished":
                    self._check_cache_setting(run, seed)
                    self.log(f"{run.name(seed)}: finished before; not run again")
                    done.append((run, seed))
                else:
                    todo.append((run, seed))
        return done, todo

    def _check_cache_setting(self, run, seed):
        """A finished run taken as this figure's must have trained with its prefix cache
        setting (the run names do not hold it): otherwise one line, before anything runs."""
        path = self.run_dir(run, seed)
        try:
            ran = runlog.read_config(path).get("cache_frozen_prefix")
        except (OSError, ValueError):
            return
        asked = str(self.cache_frozen_prefix).lower()
        if ran is not None and str(ran).lower() != asked:
            raise UserError(f"{path} finished with --cache_frozen_prefix {str(ran).lower()}, "
                            f"not {asked}: give this figure another --logdir")

    def plot(self, kind, out, runs, tables):
        if kind == "profile":
            outs = []
            for key, table in tables.items():
                name = out if len(tables) == 1 else f"{out}_{key}"
                self.call(self.command("plot") + ["profile", table, "--out", name], "plot")
                outs.append(name)
            return outs
        if kind == "energy" and not self.dry_run:  # Fig. 23 needs a sensor: drawn only from
            # the runs that measured energy
            runs = [(r, d) for r, d in runs if (runlog.read_summary(d).get("energy_j")
                                                is not None)]
            if not runs:
                self.log("no energy figure: no run measured energy on this device")
                return []
        if kind == "selection":
            runs = [d for r, d in runs if r.train_type == "elastic_training"
                    and r.rho == self.figure.selection_rho]
            runs = runs[:1]
        else:
            runs = [d for _, d in runs]
        if not runs:
            return []
        self.call(self.command("plot") + [kind] + runs + ["--out", out], "plot")
        return [out]

    # ----------------------------------------------------------------------------- the figure
    def __call__(self):
        t0 = time.perf_counter()
        fig = self.figure
        mode = ("smoke test (synthetic data, small model)" if self.smoke else
                "the paper's regime offline (no download)" if self.offline
                else "paper protocol")
        self.log(f"{fig.title}{' (ElasticTrainer only)' if self.ego else ''}: {mode}, "
                 f"{len(self.runs) * len(self.seeds)} runs, logs in {self.logdir}")
        skipped, failed, status = [], [], {}
        self.runner.start(self)
        try:
            tables = self.profile_all()
            before, todo = self.sort_runs(skipped)
            status.update({key: "finished" for key in before})
            for run, seed, result in self.runner.train(self, todo):
                status[run, seed] = result
        except KeyboardInterrupt:
            self.log("interrupted: finished runs are kept; run the same command again to go on")
            raise
        finally:
            self.runner.stop()
        done = []
        for seed in self.seeds:  # plan order, whatever order the runs ended in
            for run in self.runs:
                result = status.get((run, seed))
                if result == "finished":
                    done.append((run, self.run_dir(run, seed)))
                elif result is not None:
                    failed.append(f"{run.name(seed)}: {result}")
        written = []
        if done or self.dry_run:
            for kind, suffix in fig.plots:
                out = os.path.join(self.figdir, f"{self.key}{self.suffix}{suffix}")
                written += self.plot(kind, out, done, tables)
        if self.offline:  # our numbers beside the paper's
            from elastictrainer.experiments import offline

            written += offline.write_table(self, done, skipped)
        if self.dry_run:
            self.log(f"{self.key}{self.suffix}: {len(self.runs) * len(self.seeds)} runs to run "
                     f"(dry run: nothing ran)")
        else:
            self.log(f"{self.key}{self.suffix}: {len(done)} runs finished in "
                     f"{(time.perf_counter() - t0) / 60:.1f} min")
        verb = "would write " if self.dry_run else ""
        for out in written:
            self.log(f"  {verb}table {out}" if out.endswith(".md") else
                     f"  {verb}figure {out}.png / .pdf")
        for line in skipped:
            self.log(f"  skipped {line}")
        for line in failed:
            self.log(f"  FAILED {line}")
        return written, failed

