"""One cut's stored activations (Store): up to `views` rows per training example, keyed by its
pixels, in memory or in a file under the run directory, and how much disk such a file may
take.  An example's rows are its augmented views (one when the prefix is deterministic), filled
one per pass over the data and then drawn at random."""
import os
import shutil

import numpy as np

CACHE_DIR = "prefix_cache"  # under the run directory, for caches beyond the memory budget
# What a disk cache leaves free on its file system: other writers (checkpoints, events, the OS)
# must not meet a full disk because of it.
DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_SHARE = 0.05
# Storage types (numpy names), and how many augmented views of each image --cache_views 0
# keeps at most: measured on README command 1 (docs/design.md).
CACHE_DTYPES = ("float32", "float16")
MAX_AUTO_VIEWS = 2


def free_disk_bytes(path):
    """Bytes a disk cache under `path` may take (free space less the reserve)."""
    usage = shutil.disk_usage(path)
    return usage.free - max(DISK_RESERVE_BYTES, DISK_RESERVE_SHARE * usage.total)


def row_bytes(cut, dtype):
    """Bytes of one stored activation of `cut` in numpy `dtype`."""
    return int(np.prod(cut.shape)) * np.dtype(dtype).itemsize


class StoreFull(Exception):
    """More distinct examples than the store has rows."""


class Store:
    """A cut's activations: for each of `capacity` examples (keyed by the example's pixels) up
    to `views` rows, example e's view v in row e * views + v; a numpy array in memory, or a
    file (written with pwrite, read through a memory map).  Rows are read back as float32,
    whatever `dtype` stores them."""

    def __init__(self, cut, capacity, path=None, views=1, dtype="float32"):
        self.cut, self.capacity, self.path = cut, int(capacity), path
        self.views, self.dtype = int(views), np.dtype(dtype)
        self.keys = {}                               # pixels' hash -> example index
        self.counts = np.zeros(self.capacity, np.int64)  # views stored per example
        self.stored = 0
        shape = (self.capacity * self.views,) + tuple(cut.shape)
        self.row_bytes = row_bytes(cut, self.dtype)
        if path is None:
            self.data = np.empty(shape, self.dtype)
            self.fd = None
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            size = self.nbytes
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

    def close(self):
        self.data = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            try:
                os.remove(self.path)
            except OSError:
                pass
