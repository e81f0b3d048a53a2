"""The command line: `elastictrainer {train,profile,plot,figure}` and the paper's own scripts
(main.py, profiler.py, plot.py) are the same parsers and the same functions.

Parsing imports no TensorFlow (every name list comes from a light registry), so `--help` and bad
flags answer at once; each command imports what it runs only after its flags parsed.
"""
import argparse
import dataclasses
import os
import sys
import typing

from elastictrainer import __version__
from elastictrainer.config import ArgumentParser, comma_list, str2bool
from elastictrainer.errors import UserError, run_cli
from elastictrainer.experiments.compare import LAST_EPOCHS
from elastictrainer.config import Config
from elastictrainer import config
from elastictrainer.method import schemes


def _config_type(f):
    """The argparse type of a Config field, from its annotation (bool: str2bool)."""
    kind = f.type
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    return str2bool if kind is bool else kind


def _add_config_flag(p, f):
    """Settings field `f` (of Config, ProfileConfig or FigureConfig) as a flag of parser `p`:
    help, choices and default all from the field."""
    fl = config.flag_of(f)
    # the help names its default, so DefaultsHelpFormatter adds none; a "%" is meant literally
    text = f"{fl.help_text()} (default: {config.shown_default(f)})".replace("%", "%%")
    if fl.off_switch:
        p.add_argument(config.option_of(f), dest=f.name, action="store_false", help=text)
        return
    if fl.switch:
        p.add_argument(config.option_of(f), dest=f.name, action="store_true", help=text)
        return
    p.add_argument(config.option_of(f), type=fl.parse or _config_type(f), default=f.default,
                   choices=fl.choice_list(), metavar=fl.metavar, help=text)


def _add_settings_flags(p, settings_class):
    """Every field of a settings dataclass as a flag of `p`, in field order."""
    for f in dataclasses.fields(settings_class):
        _add_config_flag(p, f)


def settings_from_args(settings_class, args):
    """The settings dataclass the flags in `args` give."""
    return settings_class(**{f.name: getattr(args, f.name)
                             for f in dataclasses.fields(settings_class)})


# ----------------------------------------------------------------------------------- train
def train_parser(prog="elastictrainer train"):
    p = ArgumentParser(
        prog=prog,
        description="Fine-tune a vision model on the device with ElasticTrainer (train the "
                    "tensors that matter most within a step-time budget) or one of its "
                    "baselines. Writes TensorBoard events, config.json and summary.json under "
                    "LOGDIR/RUN_NAME.")
    _add_settings_flags(p, Config)
    return p


def config_from_args(args):
    return settings_from_args(Config, args)


def train_main(argv=None, prog="elastictrainer train"):
    args = train_parser(prog).parse_args(argv)
    cfg = config_from_args(args)
    cfg.validate()  # bad flags fail before TensorFlow, data or model is loaded
    from elastictrainer.train.distribution import prepare_process
    prepare_process(cfg)
    from elastictrainer.runs.loop import run

    summary = run(cfg)
    return 130 if summary["status"] == "interrupted" else 0


# ----------------------------------------------------------------------------------- profile
def profile_parser(prog="elastictrainer profile"):
    p = ArgumentParser(
        prog=prog,
        description="Profile per-tensor backward times (t_dw, t_dy) and forward/full step times "
                    "of a model on this device, and write them as a JSON timing table.")
    _add_settings_flags(p, config.ProfileConfig)
    return p


def profile_main(argv=None, prog="elastictrainer profile"):
    cfg = settings_from_args(config.ProfileConfig, profile_parser(prog).parse_args(argv))
    cfg.validate()
    from elastictrainer.profiler.run import profile_configuration
    from elastictrainer.profiler.report import summarize

    table, path = profile_configuration(
        cfg.model_name, cfg.input_size, cfg.batch_size, cfg.num_classes, cfg.weights,
        cfg.num_iterations, cfg.warmup, cfg.output, cfg.trace_dir, cfg.seed,
        progress=cfg.progress, calibrate=cfg.calibrate, optimizer=cfg.optimizer)
    if cfg.figure != "":
        from elastictrainer import plotting

        stem = os.path.splitext(os.path.basename(path))[0]
        plotting.draw_profile(table, cfg.figure or os.path.join("figures", f"profile_{stem}.png"))
    print(summarize(table))
    print(f"timing table written to {path}")
    return 0


# ----------------------------------------------------------------------------------- plot
RUNS_HELP = "run directories written by training (each holds summary.json and event files)"
PLOT_EXAMPLES = """examples:
  {prog} curves logs/resnet50_caltech_birds2011_* --out figures/fig15
  {prog} bars logs/* --out figures/fig19
  {prog} energy logs/* --out figures/fig23
  {prog} time logs/compare_* --out figures/time
  {prog} selection logs/resnet50_caltech_birds2011_elastic_training_rho0.4_seed0_...
  {prog} profile profiles/resnet50_i224_b4_c200.json

Each writes <out>.png and <out>.pdf (bars also <out>.md)."""


class _PlainSubParser(ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = argparse.HelpFormatter  # each --out help names its default
        super().__init__(*args, **kwargs)


def plot_parser(prog="elastictrainer plot"):
    p = ArgumentParser(
        prog=prog,
        description="Draw the ElasticTrainer paper's figures from run directories (their\n"
                    "summary.json and TensorBoard events), as PNG and PDF.",
        epilog=PLOT_EXAMPLES.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_PlainSubParser)
    _runs_command(
        sub, "curves", "test accuracy and training loss vs training time (Fig. 15/16)",
        "One column per dataset: test accuracy (%) per epoch on top, training loss below, "
        "against wall-clock training time (hours, or minutes for short runs); one line per "
        "scheme, seeds averaged with a min-max band.  Unfinished runs are dashed and flagged in "
        "the legend.", "figures/curves_<model>")
    _runs_command(
        sub, "bars", "best accuracy and training time per scheme (Fig. 17/19), plus a table",
        "Two panels, best test accuracy (%) and training time, one bar per scheme, grouped by "
        "model (and dataset) when the runs span several; runs differing only in seed are "
        "averaged, error bars span min to max.  Also writes <out>.md, a markdown table with the "
        "speedup over full_training of the same model and dataset, and prints it.",
        "figures/bars_<model>")
    _runs_command(
        sub, "energy", "training energy and average power per scheme (Fig. 23)",
        "Two panels, measured training energy and average power, one bar per scheme and rho, "
        "grouped as `bars` does.  Runs that measured nothing (no sensor; see energy_source in "
        "their summary.json) are left out with a note.", "figures/energy_<model>")
    _runs_command(
        sub, "time", "test accuracy against wall clock, with the levels time to accuracy counts",
        "One line per run directory: test accuracy (%) after each epoch against the training "
        "time so far, plus the profiling an elastic run paid before its loop (summary.json's "
        "profiling_s); runs that differ in a setting are labelled with it. Dashed lines at 95% "
        "and 99% of the full_training run's best accuracy and 1 point under it (the levels "
        "scripts/bench_time_to_accuracy.py reports the time to).",
        "figures/time_<model>")
    s = sub.add_parser(
        "selection", help="which tensors each re-selection trained (Fig. 21)",
        description="Heat map of the tensors trained after each re-selection of an elastic run: "
                    "x is the epoch of the re-selection, y the tensor index from the input "
                    "(bottom) to the output (top); above it, the fraction of tensors trained and "
                    "the predicted step-time ratio against rho.")
    s.add_argument("run", metavar="RUN_DIR", help="one elastic run directory")
    s.add_argument("--out", default=None,
                   help="output path without extension (default: figures/selection_<run name>)")
    t = sub.add_parser(
        "profile", help="per-tensor t_dw/t_dy bars of a profiler timing table",
        description="Bars of each tensor's weight-gradient (t_dw) and error-gradient (t_dy) "
                    "time from a table written by the profiler, input on the left.")
    t.add_argument("table", metavar="TABLE.json", help="timing table (profiles/*.json)")
    t.add_argument("--out", default=None,
                   help="output path without extension (default: figures/profile_<table name>)")
    return p


def _runs_command(sub, name, help, description, default_out):
    """A plot subcommand that takes run directories and --out."""
    c = sub.add_parser(name, help=help, description=description)
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help=RUNS_HELP)
    c.add_argument("--out", default=None,
                   help=f"output path without extension (default: {default_out})")


def plot_main(argv=None, prog="elastictrainer plot"):
    args = plot_parser(prog).parse_args(argv)
    from elastictrainer import plotting

    def default_out(kind):
        found = list(dict.fromkeys(  # quiet: the plot itself says what it skips
            r.model for r in plotting.load_runs(args.runs, warn=lambda msg: None)))
        return os.path.join("figures", f"{kind}_{found[0]}" if len(found) == 1 else kind)

    if args.command == "curves":
        paths = plotting.plot_curves(args.runs, args.out or default_out("curves"))
    elif args.command == "bars":
        paths, table = plotting.plot_bars(args.runs, args.out or default_out("bars"))
        print(table, end="")
    elif args.command == "energy":
        paths = plotting.plot_energy(args.runs, args.out or default_out("energy"))
    elif args.command == "time":
        paths = plotting.plot_time_to_accuracy(args.runs, args.out or default_out("time"))
    elif args.command == "selection":
        name = os.path.basename(os.path.normpath(args.run))
        paths = plotting.plot_selection(args.run,
                                        args.out or os.path.join("figures", f"selection_{name}"))
    else:
        stem = os.path.splitext(os.path.basename(args.table))[0]
        paths = plotting.plot_profile(args.table,
                                      args.out or os.path.join("figures", f"profile_{stem}"))
    print("wrote " + ", ".join(paths))
    return 0


# ----------------------------------------------------------------------------------- figure
def figure_parser(prog="elastictrainer figure"):
    from elastictrainer.experiments import figures

    p = ArgumentParser(prog=prog, description=figures.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", type=figures.figure_key, metavar="FIGURE",
                   help=" | ".join(figures.FIGURES) + " (or just the number: 15, 16, 17, 19)")
    _add_settings_flags(p, config.FigureConfig)
    return p


def figure_main(argv=None, prog="elastictrainer figure"):
    args = figure_parser(prog).parse_args(argv)
    cfg = settings_from_args(config.FigureConfig, args)
    cfg.validate()
    from elastictrainer.experiments.figures import Driver

    runner = None
    if cfg.ray:
        from elastictrainer.experiments.cluster import RayRunner

        runner = RayRunner(cfg.ray, cfg.ray_resources)
    driver = Driver(args.figure, ego=cfg.ego, smoke=cfg.smoke, seeds=cfg.seeds,
                    logdir=cfg.logdir, figdir=cfg.figdir, profiles=cfg.profiles,
                    data_dir=cfg.data_dir, dry_run=cfg.dry_run,
                    steps_per_epoch=cfg.steps_per_epoch, runner=runner,
                    cache_frozen_prefix=cfg.cache_frozen_prefix, offline=cfg.offline,
                    num_test=cfg.num_test)
    _, failed = driver()
    return 1 if failed else 0


# ----------------------------------------------------------------------------------- compare
def compare_parser(prog="elastictrainer compare"):
    p = train_parser(prog)
    p.description = ("Train several schemes on the same settings, one after the other, and "
                     "print one side-by-side table (best test accuracy, the mean of the last "
                     f"{LAST_EPOCHS} epochs', training time and its ratio to full training's, "
                     "measured step-time ratio); also written as "
                     "LOGDIR/RUN_NAME_compare.md.  Runs are LOGDIR/RUN_NAME_<train_type>: a "
                     "finished one is read, not run again, when it ran with the same settings "
                     "(one of other settings is refused; --resume false trains every run "
                     "over).  --train_type is ignored.")
    p.add_argument("--train_types", type=comma_list(str),
                   default="full_training,elastic_training,traditional_tl_training",
                   help="comma-separated schemes, in order")
    return p


def compare_main(argv=None, prog="elastictrainer compare"):
    args = compare_parser(prog).parse_args(argv)
    for name in args.train_types:
        schemes.SCHEMES.get_or_fail(name)
    cfg = config_from_args(args)
    if not cfg.run_name:
        cfg = dataclasses.replace(cfg, run_name="compare")
    cfg.validate()
    from elastictrainer.experiments.compare import compare, table, write_table

    rows = compare(cfg, args.train_types)
    path = write_table(rows, cfg.logdir, cfg.run_name)
    print(table(rows))
    print(f"table written to {path}")
    return 0 if all(r["status"] == "finished" for r in rows) else 130


# ----------------------------------------------------------------------------------- elastictrainer
COMMANDS = {
    "train": (train_main, "fine-tune a model (the paper's main.py)"),
    "profile": (profile_main, "profile per-tensor backward times (the paper's profiler.py)"),
    "plot": (plot_main, "draw the paper's figures from run directories"),
    "compare": (compare_main, "train several schemes on the same settings, one table"),
    "figure": (figure_main, "run and draw one of the paper's figures (scripts/run_figure*.sh)"),
}

USAGE = """usage: elastictrainer COMMAND [flags]   (elastictrainer COMMAND --help for its flags)

ElasticTrainer (MobiSys'23) on TensorFlow: train only the tensors that matter most within a
requested step-time ratio rho.

commands:
{commands}

example:
  elastictrainer profile --model_name resnet50 --num_classes 200
  elastictrainer train --model_name resnet50 --dataset_name caltech_birds2011 --rho 0.5
"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.format(commands="\n".join(f"  {name:<9}{text}"
                                              for name, (_, text) in COMMANDS.items())), end="")
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"elastictrainer {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        raise UserError(f"unknown command {argv[0]!r}; valid: {', '.join(COMMANDS)} "
                        "(see elastictrainer --help)")
    return COMMANDS[argv[0]][0](argv[1:], prog=f"elastictrainer {argv[0]}")


def console():
    """The `elastictrainer` console script."""
    run_cli(main)
