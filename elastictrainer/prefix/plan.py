"""Which cuts of a model (a functional one, tf-keras or Keras 3: graph.py) the prefix cache may
use (plan): the prefix must be deterministic per example (no BatchNorm computing batch
statistics, no random op before the cut but random input augmentation, which is kept as a few
views of each image: views_at), hold enough of the forward pass and at least one trainable
tensor (a frozen prefix to save: a cut below the first weights would only replay the input's
preprocessing), and fit the memory budget or
the disk; under --cache_frozen_prefix auto the run must also
outlast the passes that fill the cache, and under --rho auto's share objective the cut must
have no random augmentation before it (Config.cache_replays_views).  When none does, one line
says why, and no_cut_note gives it again for a refusal that follows from it."""
import os
import time
import weakref

from elastictrainer.flavors.batchnorm import FROZEN
from elastictrainer.prefix.cache import PrefixCache
from elastictrainer.prefix.graph import FlatGraph
from elastictrainer.prefix.store import MAX_AUTO_VIEWS, free_disk_bytes, row_bytes

# A cut point whose prefix holds less than this share of the forward pass (by prefix_graph's
# estimate) saves less than reading its rows costs: input rescaling, the first layer.
MIN_PREFIX_SHARE = 0.05


def why_not_distributed(trainer):
    """Why a run under a tf.distribute strategy (`trainer`, as its driver names it) trains
    uncached, in the words every driver's one line uses."""
    return (f"{trainer} trains on several replicas, and the cache keeps one process's rows "
            f"keyed by the images of one-device batches (docs/design.md)")


def plan(model, variables, cfg, capacity, run_dir, log=print, clock=time.perf_counter):
    """The PrefixCache of a run with --cache_frozen_prefix auto or true, or None when the model
    has no usable cut, none fits, or (auto) the run is too short to train from the cache: said
    in one line with why, which no_cut_note(model) gives again (for a refusal that follows from
    it).  clock: the run's, which times the steps' fills."""
    explicit = cfg.cache_frozen_prefix is True
    graph = FlatGraph(model)
    if graph.why_not:
        return _uncached(model, f"{model.name} has no cut point: {graph.why_not}", log, explicit)
    budget = cfg.cache_budget_mb * 2**20
    os.makedirs(run_dir, exist_ok=True)
    disk = free_disk_bytes(run_dir)
    everything = graph.tensor_cuts(variables)
    # cuts at or below this index hold no trainable tensor in their prefix (tensor_cuts)
    weightless = min(everything, default=-1)
    # --bn_mode frozen holds every BatchNorm layer below a selection's deepest tensor, so below
    # any cut its selections train above (flavors/batchnorm.FrozenHold)
    held = cfg.bn_mode == FROZEN
    blockers = [_blocker(graph, c, j <= weightless, held) for j, c in enumerate(graph.cuts)]
    usable = [c for c, why in zip(graph.cuts, blockers) if why is None]
    views = {id(c): views_at(c, cfg, capacity) for c in usable}

    def size(c):
        return row_bytes(c, cfg.cache_dtype) * views[id(c)] * capacity

    fits = [c for c in usable if size(c) <= max(budget, disk)]
    if fits and not explicit and not cfg.cache_replays_views:
        fresh = [c for c in fits if not c.augmentation]
        if not fresh:
            return _uncached(model, (
                "--rho auto keeps --rho_share of the estimated loss drop cached or not, so the "
                "cache would only shorten its steps, and it would replay stored augmented views "
                "of each image where an uncached run draws a fresh one every epoch"), log,
                explicit)
        fits = fresh
    if not fits:
        smallest = min((size(c) for c in usable), default=0) / 2**20
        why = (_why_no_cut(graph, blockers) if not usable else
               f"the smallest cut ({smallest:.0f} MB for {capacity} examples) fits neither "
               f"--cache_budget_mb {cfg.cache_budget_mb:g} nor the disk under {run_dir}")
        return _uncached(model, why, log, explicit)
    passes = max(views[id(c)] for c in fits)
    if not explicit and cfg.num_epochs <= passes:
        n = cfg.num_epochs
        epochs = f"{n} epoch is" if n == 1 else f"{n} epochs are"
        fills = "pass that fills" if passes == 1 else "passes that fill"
        return _uncached(model, f"the run's {epochs} used up by the {passes} {fills} the cache",
                         log, explicit)
    _NO_CACHE.pop(model, None)
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
                        views=[views[id(c)] for c in fits], dtype=cfg.cache_dtype,
                        seed=cfg.seed, log=log, clock=clock, free_disk=free_disk_bytes)
    if cfg.rho_feedback:
        # timed on this host, so with the closed loop off (selections a function of the
        # settings, seed and table alone, runs repeating bit for bit) they stay 0
        cache.time_lookups(cfg.batch_size, model.inputs[0].shape[1:])
    memory = sum(w == "memory" for w in cache.where)
    augmented = fits[-1].augmentation
    log(f"prefix cache: {len(fits)} cut points for {capacity} examples ({memory} in memory "
        f"within {cfg.cache_budget_mb:g} MB, {len(fits) - memory} on disk, {cfg.cache_dtype})"
        + (f"; random augmentation ({_named(graph, augmented)}) kept as {passes} view"
           f"{'s' if passes > 1 else ''} of each image{_fewer_views(passes, cfg.num_epochs)}"
           if augmented else ""))
    return cache


def _fewer_views(views, epochs):
    """What the log line adds when the cache keeps fewer views than an uncached run would draw:
    with few training images those views are part of what the run learns from (on
    EfficientNet-Lite0's objects target two views cost the last stage 6 points against fresh
    augmentation, four 1: scripts/bench_cache_views.py; --rho auto ended 3 and 7 points
    higher uncached on the textures target, and four views that spill to disk run no faster
    than full training: docs/performance.md)."""
    if views >= epochs:
        return ""
    return (f" where an uncached run draws {epochs} (a task that leans on its augmentation: "
            f"train uncached, --cache_frozen_prefix false, or raise --cache_views where "
            f"--cache_budget_mb holds them)")


def views_at(cut, cfg, capacity):
    """How many views of each example the cache keeps at `cut`: 1 for a deterministic prefix;
    with random augmentation before it, --cache_views (--cache_fixed_views: 1), or with 0 as
    many as --cache_budget_mb holds in memory, from 1 to MAX_AUTO_VIEWS."""
    if not cut.augmentation or cfg.cache_fixed_views:
        return 1
    if cfg.cache_views:
        return cfg.cache_views
    one = row_bytes(cut, cfg.cache_dtype) * capacity
    return int(max(1, min(MAX_AUTO_VIEWS, cfg.cache_budget_mb * 2**20 // max(one, 1))))


# Why plan() left a model uncached, for the refusal that may follow (no_cut_note).
_NO_CACHE = weakref.WeakKeyDictionary()


def no_cut_note(model):
    """What a refusal below the uncached forward floor adds for `model`: why the last plan()
    found no cut to cache at; "" when it found one or was not asked."""
    why = _NO_CACHE.get(model)
    return "" if why is None else f"; the prefix cache cannot lower it: {why}"


def _uncached(model, why, log, explicit=True):
    _NO_CACHE[model] = why
    log(f"warning: --cache_frozen_prefix: {why}; training uncached" if explicit else
        f"prefix cache off (--cache_frozen_prefix auto): {why}")
    return None


def _blocker(graph, cut, weightless=False, held=False):
    """What keeps `cut` from being cached whatever the flags, in a few words; None when
    nothing does.  weightless: no trainable tensor lies below the cut, so no selection leaves
    a frozen prefix there; caching it would only replay the input's preprocessing (and its
    augmentation, as views) while the time model priced every selection as cached.  held: the
    BatchNorm layers below a cut run on their moving statistics whenever it is used."""
    if cut.forward_share > 1 - MIN_PREFIX_SHARE:
        return f"less than {MIN_PREFIX_SHARE:.0%} of the forward pass below them"
    if cut.batch_prefix and not held:
        return (f"BatchNorm computing batch statistics below them ({cut.batch_prefix[0]}; "
                f"--bn_mode inference or frozen runs them on their moving statistics, as a "
                f"frozen one or one in a model called with training=False does; moving "
                f"statistics cannot follow a target whose images differ from the source's)")
    if cut.random_prefix:
        return f"random ops below them ({_named(graph, cut.random_prefix[:1])})"
    if weightless:
        return "no trainable tensor below them"
    return None


def _why_no_cut(graph, blockers):
    """Why none of `graph`'s cuts is usable: each reason (`blockers`, _blocker's for each
    cut) with the number of cuts it holds back, from the input up."""
    if not graph.cuts:
        return "no cut point: no tensor lies on every path from its input to its output"
    counts = {}
    for why in blockers:
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
