"""Experiment tooling on top of the library: the paper's figures as sweeps of runs
(figures.py), several schemes side by side (compare.py), a figure's runs as Ray tasks
(cluster.py, cluster_node.py), and the benchmarks' tables in the docs (perfdoc.py; README.md's
excerpts of them: readme_tables.py)."""
