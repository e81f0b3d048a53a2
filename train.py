"""The training loop, for readers of the paper's code: `run(Config(...))` trains one run.

It lives in elastictrainer/runs/loop.py (the loop), elastictrainer/config/settings.py (the
settings) and elastictrainer/method/schemes.py (what each --train_type trains); the command line
is main.py.
"""
from elastictrainer.config import Config  # noqa: F401
from elastictrainer.runs.loop import run  # noqa: F401
from elastictrainer.method.schemes import SCHEMES  # noqa: F401
