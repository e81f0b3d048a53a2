"""The training loop, for readers of the paper's code: `run(Config(...))` trains one run.

It lives in elastictrainer/loop.py (the loop), elastictrainer/config.py (the settings) and
elastictrainer/schemes.py (what each --train_type trains); the command line is main.py.
"""
from elastictrainer.config import Config  # noqa: F401
from elastictrainer.loop import run  # noqa: F401
from elastictrainer.schemes import SCHEMES  # noqa: F401
