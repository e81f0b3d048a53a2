"""A checkpoint's files on disk: making them durable once written, the checksums that tell a
damaged one from a sound one (`<prefix>.sums.json` beside the checkpoint), and removing the
files of a checkpoint that no index names.

A checkpoint `<dir>/ckpt-N` is the files `ckpt-N.index` and `ckpt-N.data-?????-of-?????` that
TensorFlow writes (through `ckpt-N_temp/`), named by the directory's index file `checkpoint`.
TensorFlow checks each tensor's CRC when it reads one, but not the bytes between them, and it
fsyncs nothing: a power cut soon after a save may leave files that were never on the disk.
Hence one pass over each file after a save, which both sums it and fsyncs it.
"""
import glob
import json
import os
import shutil
import zlib

from elastictrainer import runlog

SUMS_SUFFIX = ".sums.json"
INDEX_FILE = "checkpoint"  # tf.train.CheckpointManager's index of the kept checkpoints
_CHUNK = 4 << 20


def files_of(prefix):
    """The files TensorFlow wrote for the checkpoint `prefix`, sorted (no sums file)."""
    return sorted(glob.glob(glob.escape(prefix) + ".index")
                  + glob.glob(glob.escape(prefix) + ".data-?????-of-?????"))


def _crc_and_sync(path, sync):
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return {"size": size, "crc32": crc}


def seal(prefix):
    """Make the checkpoint `prefix` and its directory's index durable, and record each of its
    files' size and CRC-32 in `<prefix>.sums.json` (written whole or not at all)."""
    directory = os.path.dirname(prefix)
    sums = {os.path.basename(p): _crc_and_sync(p, sync=True) for p in files_of(prefix)}
    index = os.path.join(directory, INDEX_FILE)
    if os.path.exists(index):
        _crc_and_sync(index, sync=True)
    runlog.write_text(prefix + SUMS_SUFFIX, json.dumps({"files": sums}))


def damage(prefix):
    """Why the files of checkpoint `prefix` do not match its recorded checksums (a short
    phrase), or None when they match or none were recorded (a checkpoint written before
    checksums were, or one whose sums file cannot be read: TensorFlow's reader still checks
    each tensor)."""
    try:
        with open(prefix + SUMS_SUFFIX) as f:
            recorded = json.load(f)["files"]
        recorded = {str(name): (int(s["size"]), int(s["crc32"])) for name, s in recorded.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    directory = os.path.dirname(prefix)
    for name, (size, crc) in sorted(recorded.items()):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return f"{name} is missing"
        found = _crc_and_sync(path, sync=False)
        if found["size"] != size:
            return f"{name} has {found['size']} bytes, {size} were written"
        if found["crc32"] != crc:
            return f"{name} does not match the checksum recorded when it was written"
    return None


def remove_temp(prefix):
    """Delete what a save of `prefix` that did not finish leaves besides the checkpoint's own
    files: TensorFlow's temporary directory and a sums file being written."""
    shutil.rmtree(prefix + "_temp", ignore_errors=True)
    try:
        os.remove(prefix + SUMS_SUFFIX + runlog.TMP_SUFFIX)
    except FileNotFoundError:
        pass


def remove(prefix):
    """Delete every file of the checkpoint `prefix`: its data, index and sums, and what a save
    that did not finish leaves."""
    for path in files_of(prefix) + [prefix + SUMS_SUFFIX]:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    remove_temp(prefix)


def remove_stale_sums(directory, kept):
    """Delete the sums files in `directory` of checkpoints not among the prefixes `kept` (those
    the manager rotated out: it deletes only TensorFlow's own files)."""
    kept = {os.path.basename(p) for p in kept}
    for name in os.listdir(directory):
        if name.endswith(SUMS_SUFFIX) and name[:-len(SUMS_SUFFIX)] not in kept:
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass
