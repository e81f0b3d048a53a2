"""The paper's figures from your runs: `python plot.py curves logs/run1 logs/run2 ...`.

The same as `elastictrainer plot`: curves (Fig. 15/16), bars (Fig. 17/19), selection (Fig. 21),
profile (a timing table).  The drawing is in elastictrainer/plotting/.
"""
from elastictrainer.cli import plot_main
from elastictrainer.errors import run_cli


def main(argv=None):
    return plot_main(argv, prog="plot.py")


if __name__ == "__main__":
    run_cli(main)
