"""Which cuts of a model the prefix cache may use (plan): the prefix must be deterministic per
example (no BatchNorm computing batch statistics, no random op before the cut, random input
augmentation only as fixed views), hold enough of the forward pass, and fit the memory budget or
the disk; when none does, one line says why, and no_cut_note gives it again for a refusal that
follows from it."""
import os
import shutil
import weakref

from elastictrainer.errors import UserError
from elastictrainer.prefix.cache import PrefixCache
from elastictrainer.prefix.graph import FlatGraph
from elastictrainer.prefix.store import CACHE_DIR, free_disk_bytes

# A cut point whose prefix holds less than this share of the forward pass (by prefix_graph's
# estimate) saves less than reading its rows costs: input rescaling, the first layer.
MIN_PREFIX_SHARE = 0.05


def plan(model, variables, cfg, capacity, run_dir, log=print):
    """The PrefixCache of a run with --cache_frozen_prefix, or None when the model has no
    usable cut: said in one line with why, which no_cut_note(model) gives again (for a
    refusal that follows from it); UserError when only random augmentation in the prefix
    stands in the way and --cache_fixed_views is off."""
    graph = FlatGraph(model)
    if graph.why_not:
        return _uncached(model, f"{model.name} has no cut point: {graph.why_not}", log)
    budget = cfg.cache_budget_mb * 2**20
    os.makedirs(run_dir, exist_ok=True)
    shutil.rmtree(os.path.join(run_dir, CACHE_DIR), ignore_errors=True)  # a killed run's
    disk = free_disk_bytes(run_dir)
    sound = [c for c in graph.cuts if _blocker(graph, c) is None]
    usable = [c for c in sound if cfg.cache_fixed_views or not c.augmentation]
    if sound and not usable:
        layers = _named(graph, sound[-1].augmentation)
        raise UserError(f"--cache_frozen_prefix: {model.name} augments its input at random "
                        f"({layers}) before every cut point, so a cached activation would "
                        f"replay one random view of each image; pass --cache_fixed_views true "
                        f"to cache the view each image draws when the cache is filled, or "
                        f"leave the cache off")
    fits = [c for c in usable if c.bytes_per_example * capacity <= max(budget, disk)]
    if not fits:
        smallest = min((c.bytes_per_example for c in usable), default=0) * capacity / 2**20
        why = (_why_no_cut(graph) if not usable else
               f"the smallest cut ({smallest:.0f} MB for {capacity} examples) fits neither "
               f"--cache_budget_mb {cfg.cache_budget_mb:g} nor the disk under {run_dir}")
        return _uncached(model, why, log)
    _NO_CACHE.pop(model, None)
    everything = graph.tensor_cuts(variables)
    index = {id(c): i for i, c in enumerate(graph.cuts)}
    # the output-most cut that fits, at or below each tensor's own
    tensor_cut = []
    for k in everything:
        best = -1
        for j, c in enumerate(fits):
            if index[id(c)] <= k:
                best = j
        tensor_cut.append(best)
    cache = PrefixCache(graph, fits, tensor_cut, capacity, budget, run_dir,
                        cfg.cache_fixed_views, log)
    cache.time_lookups(cfg.batch_size, model.inputs[0].shape[1:])
    memory = sum(w == "memory" for w in cache.where)
    log(f"prefix cache: {len(fits)} cut points for {capacity} examples ({memory} in memory "
        f"within {cfg.cache_budget_mb:g} MB, {len(fits) - memory} on disk)"
        + (f"; random augmentation ({_named(graph, fits[-1].augmentation)}) cached as fixed "
           f"views" if fits[-1].augmentation else ""))
    return cache


# Why plan() left a model uncached, for the refusal that may follow (no_cut_note).
_NO_CACHE = weakref.WeakKeyDictionary()


def no_cut_note(model):
    """What a refusal below the uncached forward floor adds for `model`: why the last plan()
    found no cut to cache at; "" when it found one or was not asked."""
    why = _NO_CACHE.get(model)
    return "" if why is None else f"; the prefix cache cannot lower it: {why}"


def _uncached(model, why, log):
    _NO_CACHE[model] = why
    log(f"warning: --cache_frozen_prefix: {why}; training uncached")
    return None


def _blocker(graph, cut):
    """What keeps `cut` from being cached whatever the flags, in a few words; None when
    nothing does."""
    if cut.forward_share > 1 - MIN_PREFIX_SHARE:
        return f"less than {MIN_PREFIX_SHARE:.0%} of the forward pass below them"
    if cut.batch_prefix:
        return (f"BatchNorm computing batch statistics below them ({cut.batch_prefix[0]}; "
                f"--bn_mode inference runs every BatchNorm on its moving statistics, as a "
                f"frozen one or one in a model called with training=False does)")
    if cut.random_prefix:
        return f"random ops below them ({_named(graph, cut.random_prefix[:1])})"
    return None


def _why_no_cut(graph):
    """Why none of `graph`'s cuts is usable: each reason with the number of cuts it holds
    back, from the input up."""
    if not graph.cuts:
        return "no cut point: no tensor lies on every path from its input to its output"
    counts = {}
    for c in graph.cuts:
        why = _blocker(graph, c)
        counts[why] = counts.get(why, 0) + 1
    return "no usable cut point: " + "; ".join(
        f"{n} of {len(graph.cuts)} have {why}" for why, n in counts.items())


def _named(graph, layers):
    """Layer names, each with (some of) the random op types the traced prefix found in it."""
    def ops(name):
        found = graph.random_ops[name]
        return ", ".join(found[:2]) + (", ..." if len(found) > 2 else "")

    return ", ".join(f"{name} ({ops(name)})" if name in graph.random_ops else name
                     for name in layers)
