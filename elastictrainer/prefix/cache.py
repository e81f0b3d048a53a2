"""Reusing the frozen prefix's activations (--cache_frozen_prefix; not in the paper).

ElasticTrainer saves backward work only: every step still runs the whole forward pass.  When
every tensor below a cut point is frozen for the current selection, the part of the model
below the cut (the prefix) computes the same output for the same image every epoch.  This
module keeps that output for each training example and, from the second time an example is
drawn, runs only the part above the cut (the suffix), forward and backward.

- Cuts (prefix_graph.py): the tensors every path from the input to the output goes through
  (block outputs).  A selection's cut is the output-most one below all its tensors.  Only cuts
  whose prefix is deterministic per example qualify: no BatchNorm with batch statistics, no
  dropout or noise before them; random augmentation at the input only with
  --cache_fixed_views (each example then keeps the view it drew in the step that filled the
  cache, until the cache is rebuilt), and otherwise refused with one line.
- Examples are recognised by their pixels (a 64-bit hash of each image's bytes), so the loop's
  input pipeline, its order and its checkpoints stay as they are: a step whose images are all
  cached runs the suffix on their stored activations; any other step (the first pass over the
  data, a resumed run) is a fill step: the images not stored yet go through the prefix, and
  their activations are stored before the suffix trains on the batch.
- Storage: one cut at a time, one row per training example, in memory up to
  --cache_budget_mb, beyond it in a file under the run directory when the disk has room, and
  otherwise that cut is not cached (the time model then prices its selections uncached, so the
  solver moves to cuts that fit).  A selection with another cut drops the store and fills a
  new one.  A write that fails (a full disk), or more distinct images than the training set
  holds (random preprocessing in the input pipeline), turns the cache off for the rest of the
  run; the steps run uncached and nothing else is lost.
- Probes, timed full steps and evaluation run the whole model, as without the cache.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import os
import shutil
import time

import numpy as np
import tensorflow as tf

from elastictrainer.flavors import compat
from elastictrainer.train import steps as train_steps
from elastictrainer.errors import UserError
from elastictrainer.prefix.graph import FlatGraph

CACHE_DIR = "prefix_cache"  # under the run directory, for caches beyond the memory budget
# What a disk cache leaves free on its file system: other writers (checkpoints, events, the OS)
# must not meet a full disk because of it.
DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_SHARE = 0.05
# A cut point whose prefix holds less than this share of the forward pass (by prefix_graph's
# estimate) saves less than reading its rows costs: input rescaling, the first layer.
MIN_PREFIX_SHARE = 0.05


def free_disk_bytes(path):
    """Bytes a disk cache under `path` may take (free space less the reserve)."""
    usage = shutil.disk_usage(path)
    return usage.free - max(DISK_RESERVE_BYTES, DISK_RESERVE_SHARE * usage.total)


class StoreFull(Exception):
    """More distinct examples than the store has rows."""


class Store:
    """A cut's activations, one row per training example, keyed by the example's pixels;
    a numpy array in memory, or a file (written with pwrite, read through a memory map)."""

    def __init__(self, cut, capacity, path=None):
        self.cut, self.capacity, self.path = cut, int(capacity), path
        self.keys = {}
        shape = (self.capacity,) + tuple(cut.shape)
        self.dtype = np.dtype(tf.as_dtype(cut.dtype).as_numpy_dtype)
        self.row_bytes = int(np.prod(cut.shape)) * self.dtype.itemsize
        if path is None:
            self.data = np.empty(shape, self.dtype)
            self.fd = None
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            size = self.capacity * self.row_bytes
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self.fd, 0, size)  # a full disk fails here, not later
            else:
                os.ftruncate(self.fd, size)
            self.data = np.memmap(path, self.dtype, "r", shape=shape)
        except BaseException:
            self.close()
            raise

    @property
    def nbytes(self):
        return self.capacity * self.row_bytes

    @property
    def complete(self):
        return len(self.keys) >= self.capacity

    def lookup(self, keys):
        return np.array([self.keys.get(k, -1) for k in keys], np.int64)

    def read(self, rows):
        return self.data[rows]

    def add(self, keys, rows, values):
        """Store `values` of the examples whose `rows` are -1 (not stored yet)."""
        for k, row, value in zip(keys, rows, values):
            if row >= 0 or k in self.keys:
                continue
            if len(self.keys) >= self.capacity:
                raise StoreFull
            new = len(self.keys)
            value = np.ascontiguousarray(value, self.dtype)
            if self.fd is None:
                self.data[new] = value
            else:
                os.pwrite(self.fd, value.tobytes(), new * self.row_bytes)
            self.keys[k] = new

    def close(self):
        self.data = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            try:
                os.remove(self.path)
            except OSError:
                pass


@dataclasses.dataclass
class Build:
    """One store's life, as summary.json's prefix_cache "builds" lists it."""
    cut: str
    shape: list
    bytes: int
    where: str          # "memory" or the file's path
    rows: int = 0       # examples stored
    fill_steps: int = 0
    fill_s: float = 0.0
    served_steps: int = 0


class PrefixCache:
    """The cut points a run may cache at (`cuts`, from the input up, `tensor_cut` the
    output-most usable one for each trainable tensor, -1 for none), the current store, and
    its steps' statistics.  Build it with plan()."""

    def __init__(self, graph, cuts, tensor_cut, capacity, budget_bytes, run_dir, fixed_views,
                 log=print, clock=time.perf_counter):
        self.graph, self.cuts, self.tensor_cut = graph, cuts, tensor_cut
        self.capacity, self.budget_bytes, self.run_dir = capacity, budget_bytes, run_dir
        self.fixed_views, self.log, self.clock = fixed_views, log, clock
        self.where = ["memory" if c.bytes_per_example * capacity <= budget_bytes else "disk"
                      for c in cuts]
        # why the cache turned off, None while on (the elastic driver tells the runtime)
        self.store, self.builds, self.off = None, [], None
        self.served_steps = self.fill_steps = self.uncached_steps = 0
        self.fill_s, self._models = 0.0, {}
        self.lookup_ms = [0.0] * len(cuts)  # host work of a cached step (time_lookups)

    # ------------------------------------------------------------------ planning
    def time_lookups(self, batch_size, input_shape, repeats=5):
        """Time what a cached step adds on the host, per cut: hashing a batch's images and
        reading its rows (from memory; a disk store's page cache reads alike)."""
        x, rows = np.zeros((batch_size,) + tuple(input_shape), np.float32), np.arange(batch_size)
        for i, c in enumerate(self.cuts):
            data, times = np.zeros((batch_size,) + tuple(c.shape), np.float32), []
            for _ in range(repeats):
                t0 = time.perf_counter()
                self.keys(x)
                tf.convert_to_tensor(data[rows])
                times.append(time.perf_counter() - t0)
            self.lookup_ms[i] = 1e3 * float(np.median(times))

    def for_time_model(self):
        """The cuts as time_model.TimeModel takes them (plain data)."""
        return {"cuts": [{"name": c.name, "forward_share": c.forward_share, "lookup_ms": ms}
                         for c, ms in zip(self.cuts, self.lookup_ms)],
                "tensor_cut": list(self.tensor_cut)}

    def cut_of(self, selection):
        """Index of `selection`'s cut in `cuts`, None when it needs the whole forward pass."""
        if not selection:
            return None
        k = min(self.tensor_cut[i] for i in selection)
        return None if k < 0 else k

    # ------------------------------------------------------------------ steps
    def step(self, selection, variables, optimizer, loss_fn, penalty_fn, plain):
        """The train step of `selection` (tuple of indices): a CachedStep when it has a cut,
        else `plain()`, the uncached step."""
        cut = self.cut_of(selection)
        if cut is None or self.off:
            return plain()
        prefix, suffix = self._sub_models(cut)
        var_list = [variables[k] for k in selection]
        return CachedStep(
            self, cut, plain, prefix,
            lambda: train_steps.make_train_step(suffix, optimizer, loss_fn, var_list, penalty_fn))

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
        if self.store is not None and self.store.cut is self.cuts[cut]:
            return self.store
        self._drop()
        c = self.cuts[cut]
        path = (None if self.where[cut] == "memory" else
                os.path.join(self.run_dir, CACHE_DIR, f"{c.name}.bin"))
        try:
            self.store = Store(c, self.capacity, path)
        except OSError as e:
            self.turn_off(f"cannot make its {c.bytes_per_example * self.capacity / 2**20:.0f} "
                          f"MB file under {self.run_dir} ({e.strerror or e})")
            return None
        self.builds.append(Build(cut=c.name, shape=list(c.shape), bytes=self.store.nbytes,
                                 where="memory" if path is None else path))
        return self.store

    def keys(self, x):
        """One key per example: a hash of its pixels' bytes."""
        a = np.ascontiguousarray(x.numpy() if hasattr(x, "numpy") else x)
        return [hash(row.tobytes()) for row in a.reshape(a.shape[0], -1)]

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
            self.store.close()
            self.store = None

    def close(self):
        """The run ends: the store's memory and file go."""
        self._drop()
        shutil.rmtree(os.path.join(self.run_dir, CACHE_DIR), ignore_errors=True)

    def summary(self, total_steps=None):
        """summary.json's prefix_cache."""
        return {"policy": "fixed augmented views" if self.fixed_views else "deterministic prefix",
                "budget_mb": self.budget_bytes / 2**20, "examples": self.capacity,
                "cuts": [{"name": c.name, "shape": list(c.shape), "where": w,
                          "mb": c.bytes_per_example * self.capacity / 2**20,
                          "forward_share": c.forward_share}
                         for c, w in zip(self.cuts, self.where)],
                "builds": [dataclasses.asdict(b) for b in self.builds],
                "served_steps": self.served_steps, "fill_steps": self.fill_steps,
                "fill_s": self.fill_s, "uncached_steps": self.uncached_steps,
                "served_share": (self.served_steps / total_steps if total_steps else None),
                "off": self.off}


class CachedStep:
    """A selection's train step with its prefix cached (module doc): call it as the trainer's
    steps, (x, y) -> (loss, logits).  The examples of the batch not stored yet go through the
    prefix first (a forward pass in the step's training mode, of those examples only) and are
    stored; then the suffix trains on the batch's stored activations.  `filled` says whether
    the last call stored any, `compiled` whether it traced a function."""

    def __init__(self, cache, cut, plain, prefix, make_cached):
        self.cache, self.cut = cache, cut
        self._make = {"plain": plain, "cached": make_cached,
                      # any batch size, one trace: the examples to store vary in number
                      "prefix": lambda: tf.function(lambda x: prefix(x, training=True),
                                                    reduce_retracing=True)}
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

    def __call__(self, x, y):
        cache = self.cache
        store = cache.use(self.cut)
        self.filled = self.compiled = False
        if store is not None:
            keys = cache.keys(x)
            rows = store.lookup(keys)
            if (rows < 0).any():
                rows = self._fill(store, x, keys, rows)
        if store is None or rows is None:
            cache.uncached_steps += 1
            return self._fn("plain")(x, y)
        if not self.filled:
            cache.served_steps += 1
            cache.builds[-1].served_steps += 1
        return self._fn("cached")(tf.convert_to_tensor(store.read(rows)), y)

    def _fill(self, store, x, keys, rows):
        """Store the examples of `rows` -1; their rows, None when the cache turned off."""
        cache, build = self.cache, self.cache.builds[-1]
        t0 = cache.clock()
        missing = np.flatnonzero(rows < 0)
        values = self._fn("prefix")(tf.gather(x, missing)).numpy()
        self.filled = True
        try:
            store.add([keys[i] for i in missing], rows[missing], values)
        except StoreFull:
            cache.turn_off(f"the training set gave more distinct images than its "
                           f"{store.capacity} examples: they change from epoch to epoch "
                           f"(random preprocessing in the input pipeline?), so their prefix "
                           f"outputs cannot be reused")
            return None
        except OSError as e:
            cache.turn_off(f"writing {store.path} failed ({e.strerror or e})")
            return None
        seconds = cache.clock() - t0
        cache.fill_steps += 1
        cache.fill_s += seconds
        build.fill_steps += 1
        build.fill_s += seconds
        build.rows = len(store.keys)
        if store.complete:
            self.fns.pop("prefix", None)  # its graph's memory: needed again only for a new store
        return store.lookup(keys)


def _traced(fn):
    try:
        return bool(compat.concrete_functions(fn))
    except AttributeError:  # not a tf.function
        return True


def plan(model, variables, cfg, capacity, run_dir, log=print):
    """The PrefixCache of a run with --cache_frozen_prefix, or None (said in one line) when
    the model has no usable cut; UserError when only random augmentation in the prefix stands
    in the way and --cache_fixed_views is off."""
    graph = FlatGraph(model)
    if graph.why_not:
        log(f"warning: --cache_frozen_prefix: {model.name} has no cut point: {graph.why_not}; "
            f"training uncached")
        return None
    budget = cfg.cache_budget_mb * 2**20
    os.makedirs(run_dir, exist_ok=True)
    shutil.rmtree(os.path.join(run_dir, CACHE_DIR), ignore_errors=True)  # a killed run's
    disk = free_disk_bytes(run_dir)
    sound = [c for c in graph.cuts if not c.batch_prefix and not c.random_prefix
             and c.forward_share <= 1 - MIN_PREFIX_SHARE]
    usable = [c for c in sound if cfg.cache_fixed_views or not c.augmentation]
    if sound and not usable:
        layers = ", ".join(sound[-1].augmentation)
        raise UserError(f"--cache_frozen_prefix: {model.name} augments its input at random "
                        f"({layers}) before every cut point, so a cached activation would "
                        f"replay one random view of each image; pass --cache_fixed_views true "
                        f"to cache the view each image draws when the cache is filled, or "
                        f"leave the cache off")
    fits = [c for c in usable if c.bytes_per_example * capacity <= max(budget, disk)]
    if not fits:
        smallest = min((c.bytes_per_example for c in usable), default=0) * capacity / 2**20
        why = ("no cut point whose prefix is deterministic per example" if not usable else
               f"the smallest cut ({smallest:.0f} MB for {capacity} examples) fits neither "
               f"--cache_budget_mb {cfg.cache_budget_mb:g} nor the disk under {run_dir}")
        log(f"warning: --cache_frozen_prefix: {why}; training uncached")
        return None
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
        + (f"; random augmentation ({', '.join(fits[-1].augmentation)}) cached as fixed views"
           if fits[-1].augmentation else ""))
    return cache
