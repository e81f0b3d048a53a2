"""Tensor Timing Profiler, as the paper's code runs it:

    python profiler.py --model_name resnet50 --num_classes 200

The same as `elastictrainer profile`; the profiler is the package elastictrainer/profiler/.
"""
from elastictrainer.cli import profile_main
from elastictrainer.errors import run_cli


def main(argv=None):
    return profile_main(argv, prog="profiler.py")


if __name__ == "__main__":
    run_cli(main)
