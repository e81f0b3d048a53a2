"""ElasticTrainer training, as the paper's code runs it:

    python main.py --model_name resnet50 --dataset_name caltech_birds2011 --train_type elastic_training --rho 0.5

The same as `elastictrainer train`; see `python main.py --help`.  The loop is elastictrainer/runs/loop.py.
"""
from elastictrainer.cli import train_main
from elastictrainer.errors import run_cli


def main(argv=None):
    return train_main(argv, prog="main.py")


if __name__ == "__main__":
    run_cli(main)
