"""Unit tests: no TensorFlow graph is traced and no model is trained.  Pure Python and NumPy,
parsers and solvers, the elastic runtime's decisions on a fake clock, configuration, timing
table files, and the one-line errors that come before any TensorFlow work (some in a fresh
Python process).  `pytest tests/unit -q` takes about a minute."""
