"""Reusing the frozen prefix's activations (--cache_frozen_prefix; not in the paper).

ElasticTrainer saves backward work only: every step still runs the whole forward pass.  When
every tensor below a cut point is frozen for the current selection, the part of the model
below the cut (the prefix) computes the same output for the same image every epoch.  This
module keeps that output for each training example and, from the second time an example is
drawn, runs only the part above the cut (the suffix), forward and backward.  It owns the
cache of a run (PrefixCache) and its steps (CachedStep, TrainsBelowEveryCut); which cuts qualify
is plan.py's, the stored rows store.py's.

- Cuts (graph.py): the tensors every path from the input to the output goes through
  (block outputs).  A selection's cut is the output-most one below all its tensors.  Only cuts
  whose prefix is deterministic per example qualify: no BatchNorm with batch statistics, no
  random op (read from the traced prefix: dropout, noise, a user's tf.random call) before
  them.  Random augmentation at the input (before the first weights) is kept as augmented
  views: each example's first `views` passes after a store is made each store the view that
  pass drew (fill steps), and every later step trains on one of them drawn at random, so the
  suffix keeps seeing varied views (--cache_views; 1 replays the first view).  No usable cut:
  one line says why (how many cuts each reason holds back), and a refusal below the uncached
  forward floor repeats it (no_cut_note).
- Examples are recognised by their pixels (a 64-bit hash of each image's bytes), so the loop's
  input pipeline, its order and its checkpoints stay as they are: a step whose images are all
  cached runs the suffix on their stored activations; any other step (the first passes over
  the data, a resumed run) is a fill step: the images without all their views go through the
  prefix, and their activations are stored before the suffix trains on the batch.
- Storage: one cut at a time, a row per training example and view (float32, or float16 with
  --cache_dtype: half the bytes, values rounded to 11 significant bits), in memory up to
  --cache_budget_mb, beyond it in a file under the run directory when the disk has room, and
  otherwise that cut is not cached (the time model then prices its selections uncached, so the
  solver moves to cuts that fit).  A selection with another cut drops the store and fills a
  new one.  A write that fails (a full disk), or more distinct images than the training set
  holds (random preprocessing in the input pipeline), turns the cache off for the rest of the
  run; the steps run uncached and nothing else is lost.
- A store holds what the prefix computed with the weights it had then: any step that trains a
  tensor at or below a cut (a selection with no cut, or a lower cut) drops that cut's store
  before it runs, so a later selection at that cut fills it again.  Probes and timed full
  steps change no weight and keep it.
- Checkpoints write the store down (persist.py): a resumed run holds the rows, the views and
  the generator the run left alone held at that checkpoint, and trains as it would have.
- Probes, timed full steps and evaluation run the whole model, as without the cache.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import os
import time

import numpy as np
import tensorflow as tf

from elastictrainer.flavors import compat
from elastictrainer.prefix import persist
from elastictrainer.prefix.store import (Store, StoreFull, example_keys, free_disk_bytes,
                                          row_bytes)



@dataclasses.dataclass
class Build:
    """One store's life, as summary.json's prefix_cache "builds" lists it."""
    cut: str
    shape: list
    bytes: int
    where: str          # "memory" or the file's path
    rows: int = 0       # activations stored (an example's views each count)
    fill_steps: int = 0
    fill_s: float = 0.0
    served_steps: int = 0
    stale: bool = False  # dropped because a step trained a tensor at or below its cut


class PrefixCache:
    """The cut points a run may cache at (`cuts`, from the input up, `tensor_cut` the
    output-most usable one for each trainable tensor, -1 for none), the current store, and
    its steps' statistics.  Build it with plan()."""

    def __init__(self, graph, cuts, tensor_cut, capacity, budget_bytes, run_dir, views=None,
                 dtype="float32", seed=0, log=print, clock=time.perf_counter,
                 free_disk=free_disk_bytes):
        self.graph, self.cuts, self.tensor_cut = graph, cuts, tensor_cut
        # bytes a store may take on the disk under a directory (persist.save asks it too)
        self.free_disk = free_disk
        self.capacity, self.budget_bytes, self.run_dir = capacity, budget_bytes, run_dir
        self.log, self.clock = log, clock
        # augmented views kept per example at each cut (1: a deterministic prefix), and the
        # storage type: plan() sets both from the budget and the settings
        self.views = list(views or [1] * len(cuts))
        self.dtype = dtype
        self.nbytes = [row_bytes(c, dtype) * v * capacity for c, v in zip(cuts, self.views)]
        self.where = ["memory" if b <= budget_bytes else "disk" for b in self.nbytes]
        self.rng = np.random.default_rng(seed)  # which stored view a step trains on
        # why the cache turned off, None while on (the elastic driver tells the runtime)
        self.store, self.builds, self.off = None, [], None
        self.store_cut = None  # index in `cuts` of the store's cut
        self.served_steps = self.fill_steps = self.uncached_steps = 0
        self.fill_s, self._models = 0.0, {}
        self.lookup_ms = [0.0] * len(cuts)  # host work of a cached step (time_lookups)
        # rows files a kept checkpoint names (a dropped store's stays for them), and the
        # stores that did not fit on the disk to be written down (said once each)
        self.named, self.unsaved = set(), set()

    # ------------------------------------------------------------------ planning
    def time_lookups(self, batch_size, input_shape, repeats=5):
        """Time what a cached step adds on the host, per cut: hashing a batch's images and
        reading its rows (from memory; a disk store's page cache reads alike)."""
        x, rows = np.zeros((batch_size,) + tuple(input_shape), np.float32), np.arange(batch_size)
        for i, c in enumerate(self.cuts):
            data, times = np.zeros((batch_size,) + tuple(c.shape), self.dtype), []
            for _ in range(repeats):
                t0 = time.perf_counter()
                self.keys(x)
                tf.convert_to_tensor(np.asarray(data[rows], np.float32))
                times.append(time.perf_counter() - t0)
            self.lookup_ms[i] = 1e3 * float(np.median(times))

    def for_time_model(self):
        """The cuts as time_model.TimeModel takes them (plain data): with the names of the
        layers each cut's prefix runs, which the timing table's traced forward times price."""
        calls = self.graph.calls
        return {"cuts": [{"name": c.name, "forward_share": c.forward_share, "lookup_ms": ms,
                          "views": v,
                          "prefix_layers": [calls[j].layer.name for j in range(len(calls))
                                            if j not in c.suffix]}
                         for c, ms, v in zip(self.cuts, self.lookup_ms, self.views)],
                "layers": [c.layer.name for c in calls],
                "tensor_cut": list(self.tensor_cut)}

    def cut_of(self, selection):
        """Index of `selection`'s cut in `cuts`, None when it needs the whole forward pass."""
        if not selection:
            return None
        k = min(self.tensor_cut[i] for i in selection)
        return None if k < 0 else k

    # ------------------------------------------------------------------ steps
    def step(self, selection, plain, suffix_step):
        """The train step of `selection` (tuple of indices): a CachedStep when it has a cut,
        else the uncached step `plain()` in a TrainsBelowEveryCut (plain() alone once the
        cache is off).  `suffix_step(suffix_model, cut)` makes the step that trains the
        selection on a cut's stored activations; each driver makes its own (the command line's
        loop: train_steps.make_train_step; model.fit: Keras' compiled loss and metrics), called
        as the plain one with the activations in place of the images."""
        cut = self.cut_of(selection)
        if self.off:
            return plain()
        if cut is None:
            return TrainsBelowEveryCut(self, plain())
        prefix, suffix = self._sub_models(cut)
        return CachedStep(self, cut, plain, prefix, lambda: suffix_step(suffix, cut))

    def _sub_models(self, cut):
        if cut not in self._models:
            c = self.cuts[cut]
            self._models[cut] = (self.graph.prefix_model(c), self.graph.suffix_model(c))
        return self._models[cut]

    def use(self, cut):
        """The store of cut index `cut`, made (and the previous one dropped) on first use; None
        once the cache is off."""
        if self.off:
            return None
        if self.store is not None and self.store_cut == cut:
            return self.store
        self._drop()
        c = self.cuts[cut]
        path = (None if self.where[cut] == "memory" else
                persist.rows_path(self.run_dir, len(self.builds), c.name))
        try:
            self.store = Store(c, self.capacity, path, self.views[cut], self.dtype)
        except OSError as e:
            self.turn_off(f"cannot make its {self.nbytes[cut] / 2**20:.0f} "
                          f"MB file under {self.run_dir} ({e.strerror or e})")
            return None
        self.store_cut = cut
        self.builds.append(Build(cut=c.name, shape=list(c.shape), bytes=self.store.nbytes,
                                 where="memory" if path is None else path))
        return self.store

    def training(self, cut):
        """A step is about to train tensors at or above cut index `cut` and none below it (None:
        tensors below every cut): the store of a cut above `cut` would then hold what its prefix
        computed with old weights, so it goes."""
        if self.store is not None and (cut is None or self.store_cut > cut):
            self.builds[-1].stale = True
            self._drop()

    keys = staticmethod(example_keys)  # one key per example: a hash of its pixels

    def turn_off(self, why):
        """No cache from now on (the steps run uncached); says why once."""
        if self.off:
            return
        self.off = why
        self._drop()
        self.log(f"warning: --cache_frozen_prefix: {why}; the prefix cache is off for the rest "
                 f"of the run, which goes on uncached")

    def _drop(self):
        if self.store is not None:
            path = self.store.path
            self.store.close(remove=path is not None and os.path.basename(path) not in self.named)
            self.store = self.store_cut = None

    # ------------------------------------------------------------------ checkpoints
    def state(self, step):
        """What the checkpoint of global step `step` keeps of the cache (JSON-able), its store
        written down first (persist.save)."""
        try:
            saved = persist.save(self, step)
        except OSError as e:  # as any failed write of the cache's: off, and the run goes on
            self.turn_off(f"writing its store down for the checkpoint failed "
                          f"({e.strerror or e})")
            saved = None
        return {"rng": self.rng.bit_generator.state, "off": self.off,
                "builds": [dataclasses.asdict(b) for b in self.builds],
                "stats": [self.served_steps, self.fill_steps, self.uncached_steps, self.fill_s],
                "store": saved}

    def load_state(self, state):
        """The cache as a checkpoint's `state` (state()'s) saw it, its store read back; says in
        one line when the store cannot be, and the run then fills it again."""
        self.rng.bit_generator.state = state["rng"]
        self.off = state["off"]
        self.builds = [Build(**b) for b in state["builds"]]
        (self.served_steps, self.fill_steps, self.uncached_steps,
         self.fill_s) = state["stats"]
        saved = state["store"]
        if saved is None:
            return
        store = persist.load(self, saved)
        if isinstance(store, str):
            self.log(f"warning: --cache_frozen_prefix: the checkpoint's store cannot be put "
                     f"back: {store}; the run fills it again, and trains on other augmented "
                     f"views than the run left alone would have")
            return
        self.store, self.store_cut = store, saved["cut"]

    def kept(self, steps):
        """The run's checkpoints are those of global steps `steps` now: the files no other
        names go."""
        self.named = persist.prune(self.run_dir, set(steps), current=(
            None if self.store is None or self.store.path is None
            else os.path.basename(self.store.path)))

    def clear(self):
        """The run starts afresh: an earlier run's files under its directory go."""
        persist.clear(self.run_dir)

    def close(self, finished=True):
        """The run ends: the store's memory goes, and its files unless a resume may need them
        (finished false: the run stopped before its end)."""
        if self.store is not None:
            self.store.close(remove=False)
            self.store = self.store_cut = None
        if finished:
            persist.clear(self.run_dir)

    def summary(self, total_steps=None):
        """summary.json's prefix_cache."""
        k = max(self.views)
        augmented = k > 1 or any(c.augmentation for c in self.cuts)
        return {"policy": (f"{k} augmented view{'s' if k > 1 else ''} per image" if augmented
                           else "deterministic prefix"),
                "dtype": self.dtype,
                "budget_mb": self.budget_bytes / 2**20, "examples": self.capacity,
                "cuts": [{"name": c.name, "shape": list(c.shape), "where": w, "views": v,
                          "mb": b / 2**20, "forward_share": c.forward_share}
                         for c, w, v, b in zip(self.cuts, self.where, self.views, self.nbytes)],
                "builds": [dataclasses.asdict(b) for b in self.builds],
                # the most the stores held at once (one store at a time): the run's memory or
                # disk beyond an uncached run's
                "peak_mb": max((b.bytes for b in self.builds), default=0) / 2**20,
                "served_steps": self.served_steps, "fill_steps": self.fill_steps,
                "fill_s": self.fill_s, "uncached_steps": self.uncached_steps,
                "served_share": (self.served_steps / total_steps if total_steps else None),
                "off": self.off}


class CachedStep:
    """A selection's train step with its prefix cached (module doc): call it as the trainer's
    steps, (x, *rest) -> what the plain step returns (rest: the labels, and in model.fit any
    sample weights).  The examples of the batch not stored yet go through the
    prefix first (a forward pass in the step's training mode, of those examples only) and are
    stored; then the suffix trains on the batch's stored activations.  `filled` says whether
    the last call stored any and `fill_s` how long storing took (the run's clock: the rest of
    the call is the suffix step a served call runs), `compiled` whether it traced a
    function."""

    def __init__(self, cache, cut, plain, prefix, make_cached):
        self.cache, self.cut = cache, cut
        self._make = {"plain": plain, "cached": make_cached,
                      # the examples to store vary in number: one trace for any batch size,
                      # the same in every process (a resumed one stores rows equal to the bit)
                      "prefix": lambda: tf.function(
                          lambda x: prefix(x, training=True), input_signature=[tf.TensorSpec(
                              (None,) + tuple(prefix.inputs[0].shape[1:]),
                              tf.as_dtype(prefix.inputs[0].dtype))])}
        self.fns = {}
        self.filled = self.compiled = False

    def _fn(self, kind):
        fn = self.fns.get(kind)
        if fn is None:
            fn = self.fns[kind] = self._make[kind]()
        self.compiled = self.compiled or not _traced(fn)
        return fn

    def tf_functions(self):
        """The compiled functions it holds (for the step cache's size estimate)."""
        return list(self.fns.values())

    def __call__(self, x, *rest):
        cache = self.cache
        store = cache.use(self.cut)
        cache.training(self.cut)
        self.filled = self.compiled = False
        self.fill_s = 0.0
        if store is not None:
            keys = cache.keys(x)
            examples = store.lookup(keys)
            need = store.needs(examples)
            rows = (self._fill(store, x, keys, examples, need) if need.any() else
                    store.pick(examples, cache.rng))
        if store is None or rows is None:
            cache.uncached_steps += 1
            return self._fn("plain")(x, *rest)
        if not self.filled:
            cache.served_steps += 1
            cache.builds[-1].served_steps += 1
        return self._fn("cached")(tf.convert_to_tensor(store.read(rows)), *rest)

    def _fill(self, store, x, keys, examples, need):
        """Store a view of the examples that `need` one (their prefix run on this step's
        augmentation); the batch's rows, those just stored for them, None when the cache
        turned off."""
        cache, build = self.cache, self.cache.builds[-1]
        t0 = cache.clock()
        missing = np.flatnonzero(need)
        prefix = self._fn("prefix")
        values = prefix(tf.cast(tf.gather(x, missing),
                                prefix.input_signature[0].dtype)).numpy()
        self.filled = True
        rows = np.empty(len(keys), np.int64)
        have = np.flatnonzero(~need)
        rows[have] = store.pick(examples[have], cache.rng)
        try:
            rows[missing] = store.add([keys[i] for i in missing], values, cache.rng)
        except StoreFull:
            cache.turn_off(f"the training set gave more distinct images than its "
                           f"{store.capacity} examples: they change from epoch to epoch "
                           f"(random preprocessing in the input pipeline?), so their prefix "
                           f"outputs cannot be reused")
            return None
        except OSError as e:
            cache.turn_off(f"writing {store.path} failed ({e.strerror or e})")
            return None
        seconds = self.fill_s = cache.clock() - t0
        cache.fill_steps += 1
        cache.fill_s += seconds
        build.fill_steps += 1
        build.fill_s += seconds
        build.rows = store.stored
        if store.complete:
            self.fns.pop("prefix", None)  # its graph's memory: needed again only for a new store
        return rows


class TrainsBelowEveryCut:
    """The uncached train step of a selection with a tensor below every cut: call it as the
    trainer's steps.  Its update changes every prefix, so each call drops the store first."""

    def __init__(self, cache, step):
        self.cache, self.step = cache, step

    def tf_functions(self):
        """The compiled function it holds (for the step cache's size estimate)."""
        return [self.step]

    def __call__(self, *data):
        self.cache.training(None)
        return self.step(*data)


def _traced(fn):
    try:
        return bool(compat.concrete_functions(fn))
    except AttributeError:  # not a tf.function
        return True
