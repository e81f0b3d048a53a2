"""The paper's figures from your runs: `python plot.py curves logs/run1 logs/run2 ...`.

Subcommands: curves (Fig. 15/16), bars (Fig. 17/19), selection (Fig. 21), profile (a timing
table).  Each writes <out>.png and <out>.pdf; see `python plot.py COMMAND --help`.
The drawing itself is in plotting.py.
"""
import argparse
import os

import common
from common import ArgumentParser

RUNS_HELP = "run directories written by main.py (each holds summary.json and event files)"
EXAMPLES = """examples:
  python plot.py curves logs/resnet50_caltech_birds2011_* --out figures/fig15
  python plot.py bars logs/* --out figures/fig19
  python plot.py selection logs/resnet50_caltech_birds2011_elastic_training_rho0.4_seed0_...
  python plot.py profile profiles/resnet50_i224_b4_c200.json

Each writes <out>.png and <out>.pdf (bars also <out>.md)."""


class _SubParser(ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = argparse.HelpFormatter
        super().__init__(*args, **kwargs)


def build_parser():
    p = ArgumentParser(
        prog="plot.py",
        description="Draw the ElasticTrainer paper's figures from run directories written by\n"
                    "main.py (their summary.json and TensorBoard events), as PNG and PDF.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    # plain help: each --out help already names its default
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_SubParser)

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
                    "time from a table written by profiler.py, input on the left.")
    t.add_argument("table", metavar="TABLE.json", help="timing table (profiles/*.json)")
    t.add_argument("--out", default=None,
                   help="output path without extension (default: figures/profile_<table name>)")
    return p


def _runs_command(sub, name, help, description, default_out):
    """A subcommand that takes run directories and --out."""
    c = sub.add_parser(name, help=help, description=description)
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help=RUNS_HELP)
    c.add_argument("--out", default=None,
                   help=f"output path without extension (default: {default_out})")


def _default_out(kind, runs):
    import plotting

    models = list(dict.fromkeys(plotting.Run(r).model for r in runs))
    return os.path.join("figures", f"{kind}_{models[0]}" if len(models) == 1 else kind)


def main(argv=None):
    args = build_parser().parse_args(argv)
    import plotting

    if args.command == "curves":
        paths = plotting.plot_curves(args.runs, args.out or _default_out("curves", args.runs))
    elif args.command == "bars":
        paths, table = plotting.plot_bars(args.runs, args.out or _default_out("bars", args.runs))
        print(table, end="")
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


if __name__ == "__main__":
    common.run_cli(main)
