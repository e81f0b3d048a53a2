"""`python -m elastictrainer COMMAND ...`, the same as the `elastictrainer` command."""
from elastictrainer.cli import console

console()
