"""Caching the frozen prefix's activations (not in the paper): the model as a flat graph of
layer calls, its cut points and the random ops of its traced prefix (graph.py); which cuts
qualify and fit, and why none does (plan.py); one cut's stored activations (store.py); the
cache and the step that fills and reads it (cache.py)."""
