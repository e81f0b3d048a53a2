"""Several schemes on the same settings and one side-by-side table, here on the built-in smallcnn:

    python compare.py --model_name smallcnn --weights synthetic --dataset_name synthetic --input_size 64 --rho 0.5

The same as `elastictrainer compare`; see `python compare.py --help`.
"""
from elastictrainer.cli import compare_main
from elastictrainer.errors import run_cli


def main(argv=None):
    return compare_main(argv, prog="compare.py")


if __name__ == "__main__":
    run_cli(main)
