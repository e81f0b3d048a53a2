"""The prefix cache in a run's checkpoints: what makes a resumed cached run train as the run
left alone would have, bit for bit.

A store holds activations that the prefix computed from augmented views drawn before the
checkpoint; a resumed run that refilled it would draw other views, and from then on train on
other activations.  So each checkpoint writes the store down (`save`):
- its rows, in one file per store under the run's prefix_cache directory
  (`<build>-<cut>.bin`): a file store is its own, a memory store's new rows are appended at
  each checkpoint (rows are only ever added while a store lives, so each is written once);
- its index (each example's key and how many views it holds) in `index-<step>.npz`, beside the
  checkpoint of that global step;
- in the checkpoint's loop state (`state`): which build and file, the generator that draws a
  served step's view, the cache's statistics and whether it turned off.
Files are made durable (fsync, then the directory) before the checkpoint that names them is
written.  `load` puts the store back as that checkpoint saw it; `prune` removes the files no
kept checkpoint names.  A memory store whose rows do not fit on the disk is not written down:
the run says so once, and a resume refills it (training goes on, not bit for bit).
"""
import os
import re
import shutil

import numpy as np

from elastictrainer import runlog
from elastictrainer.prefix.store import CACHE_DIR, Store

INDEX = "index-{step}.npz"


def rows_path(run_dir, build, cut_name):
    """The rows file of the run's store number `build` (its place in the cache's builds)."""
    return os.path.join(run_dir, CACHE_DIR, f"{build}-{cut_name}.bin")


def save(cache, step):
    """Write the cache's store down for the checkpoint of global step `step`: what that
    checkpoint keeps of it (JSON-able), None when there is no store or it was not written."""
    store = cache.store
    if store is None:
        return None
    build = len(cache.builds) - 1
    path = rows_path(cache.run_dir, build, cache.cuts[cache.store_cut].name)
    if store.fd is None and not os.path.exists(path):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        if cache.free_disk(directory) < store.nbytes:
            if build not in cache.unsaved:
                cache.unsaved.add(build)
                cache.log(f"warning: --cache_frozen_prefix: the {store.nbytes / 2**20:.0f} MB "
                          f"store does not fit on the disk under {cache.run_dir} beside the "
                          f"checkpoints; a resumed run fills it again, and trains on other "
                          f"augmented views than this run would have")
            return None
    store.persist(path)
    index = os.path.join(cache.run_dir, CACHE_DIR, INDEX.format(step=int(step)))
    # the temporary name keeps the ending: numpy adds ".npz" to a name without it
    runlog.replace_durably(index, lambda tmp: np.savez(tmp, build=build, **store.index()),
                           tmp=index + ".tmp.npz")
    return {"build": build, "cut": cache.store_cut, "file": os.path.basename(path),
            "index": os.path.basename(index)}


def load(cache, saved):
    """The store a checkpoint wrote down (save's `saved`), as it was then, or why it cannot be
    read (a string)."""
    directory = os.path.join(cache.run_dir, CACHE_DIR)
    cut = saved["cut"]
    path = os.path.join(directory, saved["file"])
    try:
        with np.load(os.path.join(directory, saved["index"])) as f:
            index = {"keys": f["keys"], "counts": f["counts"]}
        on_disk = cache.where[cut] != "memory"
        return Store.reopen(cache.cuts[cut], cache.capacity, cache.views[cut], cache.dtype,
                            path, index, path=path if on_disk else None)
    except (OSError, ValueError, KeyError) as e:
        return f"its files under {directory} cannot be read ({e})"


def prune(run_dir, steps, current=None):
    """Remove the index files of checkpoints other than `steps` (the global steps of those
    kept) and the rows files none of them names, but for `current` (the live store's file);
    the names of the rows files the kept checkpoints name."""
    directory = os.path.join(run_dir, CACHE_DIR)
    if not os.path.isdir(directory):
        return set()
    named = set()
    names = os.listdir(directory)
    for name in names:
        found = re.fullmatch(r"index-(\d+)\.npz", name)
        if found is None:
            if name.endswith(".tmp.npz"):
                os.remove(os.path.join(directory, name))
            continue
        if int(found.group(1)) not in steps:
            os.remove(os.path.join(directory, name))
            continue
        try:
            with np.load(os.path.join(directory, name)) as f:
                build = int(f["build"])
        except (OSError, ValueError, KeyError):
            continue
        named.update(n for n in names if n.startswith(f"{build}-") and n.endswith(".bin"))
    for name in names:
        if name.endswith(".bin") and name not in named and name != current:
            os.remove(os.path.join(directory, name))
    return named


def clear(run_dir):
    """A run that starts afresh: no earlier run's cache files."""
    shutil.rmtree(os.path.join(run_dir, CACHE_DIR), ignore_errors=True)
