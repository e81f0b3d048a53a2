"""End-to-end tests: what a user runs, as they run it: the README's example, main.py,
profiler.py and the scripts as subprocesses, the smoke figure, and a run killed and resumed."""
