"""The timing table's format (paper Sec. 5's per-tensor times, as profiler/run.py writes them):
its records, their validation, and the migration of a table an older profiler wrote.

No TensorFlow: training, plotting and the figure driver read tables without starting it.

The format is declared once, by the dataclasses below: TimingTable and the records it holds
(TensorTiming, Calibration, CalibrationReference, UnattributedOp).  A table profiler/run.py
writes reads back through them unchanged (tests/integration/test_profiler.py holds it to
that); TimingTable.from_dict validates a table dict and migrates an older table
(migrate_table).  Where tables live and how they are read and written is table.py's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from elastictrainer.errors import UserError

# The format version every table records.  Raise it when a table of the new format would be
# misread by code that knows only the old one (a key renamed, a unit or a meaning changed), and
# add the step from the old version to migrate_table.  A new key that older tables can lack
# needs no new version: older code keeps it as an unknown key, migrate_table fills it in.
TABLE_VERSION = 1
# Tables written before the profiler took the run's optimizer were all profiled with SGD.
DEFAULT_OPTIMIZER = "sgd"


class _Bad(ValueError):
    """One validation failure; from_dict turns it into a UserError naming the file."""


class _Record:
    """A dataclass of the table's format.  Keys the format does not declare (a hand-written
    note, a key from a newer profiler of the same version) are kept in `extra` and written
    back after the declared ones, so reading a table never loses anything."""

    @classmethod
    def _names(cls):
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def _split(cls, d, what):
        if not isinstance(d, dict):
            raise _Bad(f"{what} is not a JSON object")
        names = cls._names()
        missing = [n for n in names if n not in d]
        if missing:
            raise _Bad(f"{what} lacks {', '.join(missing)}")
        return ({n: _plain(d[n]) for n in names},
                {k: _plain(v) for k, v in d.items() if k not in names})

    def to_dict(self):
        out = {n: _plain(getattr(self, n)) for n in self._names()}
        out.update(_plain(self.extra))
        return out


def _plain(v):
    """`v` as JSON-able plain data, copied (the dict a caller gets shares nothing with the
    record it came from)."""
    if isinstance(v, _Record):
        return v.to_dict()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v):
    return _is_number(v) and math.isfinite(v)


@dataclass
class TensorTiming(_Record):
    """One trainable tensor, in model.trainable_weights order."""
    name: str             # the variable's name; load_table matches it against the model's
    shape: list | None    # the variable's shape (None: not recorded)
    t_dw_ms: float        # op time only this tensor's training needs (weight gradient, update)
    t_dy_ms: float        # error-gradient op time needed once anything at or below it trains
    estimated: bool       # t_dw_ms estimated from FLOPs: the trace missed the tensor
    rank: int             # 0 = output-most, counting back towards the input
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d, k):
        known, extra = cls._split(d, f"tensor {k}")
        if not isinstance(known["name"], str):
            raise _Bad(f"tensor {k} has name {known['name']!r}, not a string")
        for key in ("t_dw_ms", "t_dy_ms"):
            if not (_finite(known[key]) and known[key] >= 0):
                raise _Bad(f"tensor {k} has {key} {known[key]}; times must be finite and >= 0")
        if not (_is_int(known["rank"]) and known["rank"] >= 0):
            raise _Bad(f"tensor {k} has rank {known['rank']!r}, not an integer >= 0")
        if not isinstance(known["estimated"], bool):
            raise _Bad(f"tensor {k} has estimated {known['estimated']!r}, not true or false")
        shape = known["shape"]
        if shape is not None and not (isinstance(shape, list) and all(map(_is_int, shape))):
            raise _Bad(f"tensor {k} has shape {shape!r}, not a list of integers")
        return cls(**known, extra=extra)


@dataclass
class UnattributedOp(_Record):
    """A backward op whose time no tensor was charged with (per step)."""
    name: str
    ms: float
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d, k):
        known, extra = cls._split(d, f"unattributed op {k}")
        if not isinstance(known["name"], str) or not _finite(known["ms"]):
            raise _Bad(f"unattributed op {k} needs a name and a finite ms")
        return cls(**known, extra=extra)


@dataclass
class CalibrationReference(_Record):
    """One selection timed for real to calibrate the time model (calibration.py)."""
    name: str                 # calibration.reference_selections' name for it
    selected: int             # how many tensors it trains
    measured_ratio: float     # its step time / the full step's, timed
    uniform_ratio: float      # the same, predicted with the uniform scale
    calibrated_ratio: float   # the same, predicted with the fitted scales and fixed cost
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d, k):
        known, extra = cls._split(d, f"reference {k}")
        if not isinstance(known["name"], str) or not _is_int(known["selected"]):
            raise _Bad(f"reference {k} needs a name and an integer selected")
        for key in ("measured_ratio", "uniform_ratio", "calibrated_ratio"):
            if not _finite(known[key]):
                raise _Bad(f"reference {k} has {key} {known[key]}, not a finite number")
        return cls(**known, extra=extra)


@dataclass
class Calibration(_Record):
    """The time model's fitted scales (calibration.fit_fixed_cost)."""
    dw_scale: float           # ms of wall time per ms of t_dw op time
    dy_scale: float           # ms of wall time per ms of t_dy op time
    fixed_ms: float           # what a partial step pays beyond the timed forward pass (may be < 0)
    uniform_scale: float      # the one scale used without calibration (time_model.uniform_scale)
    references: list[CalibrationReference]
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d, t_fp_ms, t_full_ms):
        known, extra = cls._split(d, "calibration")
        if not all(_finite(known[k]) and known[k] >= 0
                   for k in ("dw_scale", "dy_scale", "uniform_scale")):
            raise _Bad("scales must be finite and >= 0")
        fixed = known["fixed_ms"]
        # negative: the forward pass costs less inside a step than timed alone
        if not (_finite(fixed) and -t_fp_ms < fixed < t_full_ms):
            raise _Bad(f"fixed_ms {fixed} is not in (-t_fp_ms, t_full_ms)")
        if not isinstance(known["references"], list):
            raise _Bad("references is not a list")
        known["references"] = [CalibrationReference.from_dict(r, k)
                               for k, r in enumerate(known["references"])]
        return cls(**known, extra=extra)


# Scalar keys of a table: (what a valid value is, how to say it).  Tensors, unattributed ops and
# the calibration are records of their own.
_SCALARS = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "input_size": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "batch_size": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "num_classes": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "optimizer": (lambda v: isinstance(v, str), "a string"),
    "t_bp_ms": (_is_number, "a number"),
    "t_fp_ops_ms": (lambda v: v is None or _finite(v), "a finite number"),
    "t_bp_ops_ms": (lambda v: v is None or _finite(v), "a finite number"),
    "coverage": (_finite, "a finite number"),
    "t_fp_layers_ms": (lambda v: v is None or (isinstance(v, dict) and all(
        _finite(x) and x >= 0 for x in v.values())), "a JSON object of ms >= 0"),
    "num_iterations": (lambda v: v is None or (_is_int(v) and v >= 1), "a positive integer"),
    "timing_note": (lambda v: v is None or isinstance(v, str), "a string"),
    "created": (lambda v: v is None or isinstance(v, str), "a string"),
    "host": (lambda v: v is None or isinstance(v, dict), "a JSON object"),
    "trace": (lambda v: v is None or isinstance(v, str), "a string"),
    "profiling_wall_s": (lambda v: v is None or _is_number(v), "a number"),
    "profiling_phases_s": (lambda v: v is None or (isinstance(v, dict) and all(
        map(_is_number, v.values()))), "a JSON object of seconds"),
    "peak_rss_mb": (lambda v: v is None or _is_number(v), "a number"),
    "compile_ms": (lambda v: v is None or (_finite(v) and v >= 0), "a number >= 0"),
    "calibration_skipped": (lambda v: v is None or isinstance(v, str), "a string"),
    "profiled_pid": (lambda v: v is None or _is_int(v), "an integer"),
}


@dataclass
class TimingTable(_Record):
    """A profiled model configuration's step times: what profiler/run.py writes, in its order.

    Times are per training step in ms, medians over the profiled iterations.
    """
    version: int                   # TABLE_VERSION when written; migrate_table raises older ones
    model: str                     # the --model_name profiled
    input_size: int
    batch_size: int
    num_classes: int
    optimizer: str                 # the optimizer whose update ops the step ran (flavors.optimizers.OPTIMIZERS)
    t_fp_ms: float                 # forward pass alone, timed
    t_full_ms: float               # full training step, timed
    t_bp_ms: float                 # t_full_ms - t_fp_ms
    t_grads_ms: float | None       # a full step without the optimizer's update (None: not timed)
    t_fp_ops_ms: float | None      # traced forward op time
    t_bp_ops_ms: float | None      # traced backward and update op time
    t_fp_layers_ms: dict | None    # traced forward op time by layer name (None: not recorded)
    coverage: float                # share of t_bp_ops_ms attributed to tensors
    unattributed: list[UnattributedOp]   # the largest ops not attributed, largest first
    num_iterations: int | None     # steps timed and traced
    timing_note: str | None        # why a timed value was replaced (a busy machine), if one was
    compile_ms: float | None       # compiling a selection's step, the longest of the
                                   # references' (a run's first profiling that skipped them:
                                   # the probe step's; None: not timed)
    calibration: Calibration | None     # None: uncalibrated, one uniform scale
    calibration_skipped: str | None     # why a run's first profiling did not calibrate
    tensors: list[TensorTiming]
    created: str | None            # ISO time of profiling
    host: dict | None              # platform, processor, tensorflow, devices
    trace: str | None              # the kept .xplane.pb, None when it was deleted
    profiling_wall_s: float | None
    profiling_phases_s: dict | None    # where those seconds went (profiler/phases.py)
    peak_rss_mb: float | None      # the profiling process's peak memory
    profiled_pid: int | None       # the process that profiled (a child of training's, or not)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d, path="<timing table>"):
        """Validate a table dict (as json.load gives it) and return it migrated to
        TABLE_VERSION; one UserError line naming `path` for anything wrong."""
        if not isinstance(d, dict):
            raise UserError(f"corrupt timing table {path}: not a JSON object")
        if "version" in d:  # checked before anything else: a newer format may differ anywhere
            version = d["version"]
            if not (_is_int(version) and version >= 1):
                raise UserError(f"corrupt timing table {path}: version {version!r} is not a "
                                f"positive integer")
            if version > TABLE_VERSION:
                raise UserError(f"timing table {path} has format version {version}, newer than "
                                f"this ElasticTrainer reads ({TABLE_VERSION}); upgrade "
                                f"elastictrainer or re-run profiler.py")
        try:
            return cls._validated(migrate_table(d))
        except _Bad as e:
            raise UserError(f"corrupt timing table {path}: {e}") from None

    @classmethod
    def _validated(cls, d):
        missing = [n for n in cls._names() if n not in d]
        if missing:
            raise _Bad(f"missing {', '.join(missing)}")
        known = {n: _plain(d[n]) for n in cls._names()}
        extra = {k: _plain(v) for k, v in d.items() if k not in known}
        t_fp, t_full = known["t_fp_ms"], known["t_full_ms"]
        if not (_finite(t_fp) and _finite(t_full) and 0 <= t_fp < t_full):
            raise _Bad(f"need 0 <= t_fp_ms < t_full_ms, finite; got t_fp_ms {t_fp}, "
                       f"t_full_ms {t_full}")
        for key, (ok, what) in _SCALARS.items():
            if not ok(known[key]):
                raise _Bad(f"{key} {known[key]!r} is not {what}")
        if not isinstance(known["tensors"], list):
            raise _Bad("tensors is not a list")
        try:
            known["tensors"] = [TensorTiming.from_dict(t, k)
                                for k, t in enumerate(known["tensors"])]
        except _Bad as e:
            raise _Bad(f"bad tensor entry ({e})") from None
        grads = known["t_grads_ms"]
        if grads is not None and not (_finite(grads) and grads > 0):
            raise _Bad(f"t_grads_ms {grads} must be positive")
        if known["calibration"] is not None:
            try:
                known["calibration"] = Calibration.from_dict(known["calibration"], t_fp, t_full)
            except _Bad as e:
                raise _Bad(f"bad calibration ({e})") from None
        if not isinstance(known["unattributed"], list):
            raise _Bad("unattributed is not a list")
        known["unattributed"] = [UnattributedOp.from_dict(u, k)
                                 for k, u in enumerate(known["unattributed"])]
        return cls(**known, extra=extra)


# What a table that predates a key means by its absence.  Every table the profiler has written
# so far records version 1, also those written before some of these keys were recorded.
_TABLE_DEFAULTS = {
    "optimizer": DEFAULT_OPTIMIZER,  # profiled with SGD's update ops
    "t_grads_ms": None,              # not timed: a run takes its no-update steps as full ones
    "calibration": None,             # uncalibrated: one uniform scale for t_dw and t_dy
    "calibration_skipped": None,     # calibrated, or not asked to (profiler.py --calibrate)
    "timing_note": None,             # no timed value replaced
    "compile_ms": None,              # a selection's compile not timed
    "peak_rss_mb": None,             # provenance not recorded ...
    "profiled_pid": None,
    # ... and provenance a hand-written table need not give
    "t_fp_ops_ms": None, "t_bp_ops_ms": None, "t_fp_layers_ms": None, "num_iterations": None,
    "created": None,
    "host": None, "trace": None, "profiling_wall_s": None, "profiling_phases_s": None,
}
_TENSOR_DEFAULTS = {"shape": None, "estimated": False}  # a hand-written table's tensors
_CALIBRATION_DEFAULTS = {"fixed_ms": 0.0}  # a calibration that fitted no fixed cost (by hand)
# What every table, of any version, must hold itself.
REQUIRED_KEYS = tuple(n for n in TimingTable._names()
                      if n not in _TABLE_DEFAULTS and n != "version")


def migrate_table(d):
    """A table dict of TABLE_VERSION or older as one of TABLE_VERSION: a new dict (`d` is left
    as it is) with the defaults above for what an older table lacks.  A table without a
    version (written by hand) is read as version 1.  Not validated: a corrupt entry is left
    for TimingTable.from_dict to name.  When TABLE_VERSION is raised, the step from the
    version before is added here, after the ones before it."""
    out = dict(d)
    out.update((k, v) for k, v in _TABLE_DEFAULTS.items() if k not in out)
    if isinstance(out.get("tensors"), list):
        out["tensors"] = [dict(_TENSOR_DEFAULTS, **t) if isinstance(t, dict) else t
                          for t in out["tensors"]]
    if isinstance(out.get("calibration"), dict):
        out["calibration"] = dict(_CALIBRATION_DEFAULTS, **out["calibration"])
    out["version"] = TABLE_VERSION
    return out
