"""One cut's stored activations (Store): up to `views` rows per training example, keyed by its
pixels, in memory or in a file under the run directory, and how much disk such a file may
take.  An example's rows are its augmented views (one when the prefix is deterministic), filled
one per pass over the data and then drawn at random.

A store is also written down for the run's checkpoints (`persist`, `reopen`): its rows in a
file, and its index (which example each key is, how many views each holds) beside each
checkpoint, so that a resumed run holds exactly the rows the run left alone held then."""
import hashlib
import os
import shutil

import numpy as np

from elastictrainer import runlog

CACHE_DIR = "prefix_cache"  # under the run directory, for caches beyond the memory budget
# What a disk cache leaves free on its file system: other writers (checkpoints, events, the OS)
# must not meet a full disk because of it.
DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_SHARE = 0.05
# Storage types (numpy names), and how many augmented views of each image --cache_views 0
# keeps at most: measured on the smallcnn setting (docs/design.md).
CACHE_DTYPES = ("float32", "float16")
MAX_AUTO_VIEWS = 2


def free_disk_bytes(path, disk_usage=shutil.disk_usage):
    """Bytes a disk cache under `path` may take (free space less the reserve; negative when
    the disk is fuller than that)."""
    usage = disk_usage(path)
    return usage.free - max(DISK_RESERVE_BYTES, DISK_RESERVE_SHARE * usage.total)


def row_bytes(cut, dtype):
    """Bytes of one stored activation of `cut` in numpy `dtype`."""
    return int(np.prod(cut.shape)) * np.dtype(dtype).itemsize


def example_keys(x):
    """One key per example of the batch `x` (numpy or a tensor): the first 8 bytes of the SHA-1
    of its pixels' bytes, as an int.  The same in every process (Python's own hash of bytes is
    salted per process), so a checkpoint's index names the same examples after a restart."""
    a = np.ascontiguousarray(x.numpy() if hasattr(x, "numpy") else x)
    return [int.from_bytes(hashlib.sha1(row.tobytes()).digest()[:8], "little")
            for row in a.reshape(a.shape[0], -1)]


class StoreFull(Exception):
    """More distinct examples than the store has rows."""


class Store:
    """A cut's activations: for each of `capacity` examples (keyed by the example's pixels) up
    to `views` rows, example e's view v in row e * views + v; a numpy array in memory, or a
    file (written with pwrite, read through a memory map).  Rows are read back as float32,
    whatever `dtype` stores them."""

    def __init__(self, cut, capacity, path=None, views=1, dtype="float32", reopen=False):
        """reopen: `path` is the file of a store a checkpoint wrote down (reopen()), kept as it
        is rather than made anew."""
        self.cut, self.capacity, self.path = cut, int(capacity), path
        self.views, self.dtype = int(views), np.dtype(dtype)
        self.keys = {}                               # pixels' hash -> example index
        self.counts = np.zeros(self.capacity, np.int64)  # views stored per example
        # views per example already in the rows file that `persist` writes (a memory store's)
        self.persisted = np.zeros(self.capacity, np.int64)
        self.stored = 0
        shape = (self.capacity * self.views,) + tuple(cut.shape)
        self.row_bytes = row_bytes(cut, self.dtype)
        if path is None:
            self.data = np.empty(shape, self.dtype)
            self.fd = None
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.fd = os.open(path, os.O_RDWR if reopen else os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                          0o600)
        try:
            if not reopen:
                _allocate(self.fd, self.nbytes)
            self.data = np.memmap(path, self.dtype, "r", shape=shape)
        except BaseException:
            self.close()
            raise

    @property
    def nbytes(self):
        return self.capacity * self.views * self.row_bytes

    @property
    def complete(self):
        return self.stored >= self.capacity * self.views

    def lookup(self, keys):
        """Example index of each key, -1 for one not stored yet."""
        return np.array([self.keys.get(k, -1) for k in keys], np.int64)

    def needs(self, examples):
        """Which of `examples` (lookup's indices) want a view stored: new ones, and those with
        fewer than `views` views."""
        seen = examples >= 0
        short = np.zeros(len(examples), bool)
        short[seen] = self.counts[examples[seen]] < self.views
        return ~seen | short

    def pick(self, examples, rng):
        """A row of each of `examples` (all stored), its view drawn at random among those
        stored."""
        return examples * self.views + rng.integers(0, self.counts[examples])

    def read(self, rows):
        return np.asarray(self.data[rows], np.float32)

    def add(self, keys, values, rng):
        """Store `values` as the next view of the examples with `keys`; the row of each (an
        existing view drawn at random for an example that already has all its views, as a key
        twice in one batch can)."""
        rows = np.empty(len(keys), np.int64)
        for i, (k, value) in enumerate(zip(keys, values)):
            e = self.keys.get(k)
            if e is None:
                if len(self.keys) >= self.capacity:
                    raise StoreFull
                e = self.keys[k] = len(self.keys)
            v = int(self.counts[e])
            if v >= self.views:
                rows[i] = e * self.views + rng.integers(0, self.views)
                continue
            row = e * self.views + v
            value = np.ascontiguousarray(value, self.dtype)
            if self.fd is None:
                self.data[row] = value
            else:
                os.pwrite(self.fd, value.tobytes(), row * self.row_bytes)
            self.counts[e] = v + 1
            self.stored += 1
            rows[i] = row
        return rows

    # ------------------------------------------------------------------ checkpoints
    def index(self):
        """What a checkpoint keeps of the store besides its rows: each example's key in the
        order of the examples, and how many views each holds."""
        keys = np.zeros(self.capacity, np.uint64)
        for k, e in self.keys.items():
            keys[e] = k
        return {"keys": keys[:len(self.keys)], "counts": self.counts.copy()}

    def persist(self, rows_path):
        """Make every row stored so far durable in `rows_path` (a memory store writes the rows
        added since its last call there; a file store is its own rows file, made durable)."""
        if self.fd is not None:
            os.fsync(self.fd)
            return
        new = self.counts > self.persisted
        if not new.any():
            return
        fresh = not os.path.exists(rows_path)
        fd = os.open(rows_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if fresh:
                _allocate(fd, self.nbytes)
            for e in np.flatnonzero(new):
                first, end = e * self.views + self.persisted[e], e * self.views + self.counts[e]
                os.pwrite(fd, self.data[first:end].tobytes(), int(first) * self.row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        if fresh:
            runlog.fsync_dir(os.path.dirname(rows_path))
        self.persisted = self.counts.copy()

    @classmethod
    def reopen(cls, cut, capacity, views, dtype, rows_path, index, path=None):
        """The store a checkpoint wrote down: its index, and its rows read from `rows_path`
        (into memory, or kept in that file when `path` is it: a file store's own).  Rows the
        file holds beyond the index's counts were stored after the checkpoint and are not
        counted: the resumed run stores them again."""
        store = cls(cut, capacity, path, views, dtype, reopen=path is not None)
        if path is None:
            rows = np.memmap(rows_path, store.dtype, "r", shape=store.data.shape)
            store.data[...] = rows
            del rows
        store.keys = {int(k): e for e, k in enumerate(index["keys"])}
        store.counts = np.asarray(index["counts"], np.int64).copy()
        store.persisted = store.counts.copy()
        store.stored = int(store.counts.sum())
        return store

    def close(self, remove=True):
        """Free the store; remove=False keeps a file store's file (a checkpoint names it)."""
        self.data = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if remove:
                try:
                    os.remove(self.path)
                except OSError:
                    pass


def _allocate(fd, size):
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)  # a full disk fails here, not later
    else:
        os.ftruncate(fd, size)
