"""One cut's stored activations (Store): a row per training example, keyed by its pixels, in
memory or in a file under the run directory, and how much disk such a file may take."""
import os
import shutil

import numpy as np
import tensorflow as tf

CACHE_DIR = "prefix_cache"  # under the run directory, for caches beyond the memory budget
# What a disk cache leaves free on its file system: other writers (checkpoints, events, the OS)
# must not meet a full disk because of it.
DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_SHARE = 0.05


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
