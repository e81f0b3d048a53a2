"""Caching the frozen prefix's activations (not in the paper): the model as a flat graph of
layer calls and its cut points (graph.py), and the store of one cut's activations with the step
that fills and reads it (cache.py)."""
