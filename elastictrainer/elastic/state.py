"""The elastic runtime's records and state, as typed objects: what summary.json lists for
each selection and correction, what the run ends with (EndResult: summary.json's run-level
numbers, the economy's choice and the closing line's words), and what a checkpoint keeps of
the runtime (ElasticState, with its layout version).  Plain Python."""
import dataclasses
from typing import List, Optional

# what re-selecting spends its time on (summary.json reselection_overhead_parts_s)
OVERHEAD_PARTS = ("importance", "timing full steps", "compiling", "solving")
# A selection record's reason when the run trains every tensor because it is too short to pay
# for a selection's compile (economy.py); summary.json readers and the closing line test it.
SHORT_RUN = "short run: all tensors"
# A selection record's reason for the head warm-up: a new classifier head trains alone before
# the first probes (runtime.py, --head_warmup).
HEAD_WARMUP = "head warm-up"
# Version of ElasticState's layout in checkpoints (from_dict migrates older ones: version 3
# added `readout` and `economy`, version 4 `warmup_left`, `warmup_steps` and `losses`; their
# defaults are what a run of the version before had; version 5 added `paced`).
STATE_VERSION = 5


@dataclasses.dataclass
class SelectionRecord:
    """One selection as summary.json's "selections" lists it (plots read these keys)."""
    step: int
    epoch: float
    reason: str
    mask: List[int]
    predicted_ratio: float
    limited_by: str
    solve_ms: float
    importance: List[float]
    measured_before: Optional[float] = None
    importance_ms: Optional[float] = None
    full_step_ms: Optional[float] = None
    measured_ratio: Optional[float] = None
    step_ms: Optional[float] = None
    steps: int = 0
    full_steps: int = 0  # probe and timed full steps trained while this selection was current
    cut: Optional[str] = None  # the cut its steps run from once its frozen prefix is cached
    fill_steps: int = 0  # its steps that stored images in the prefix cache (ran the prefix)
    rho: Optional[float] = None  # the ratio it was solved for: rho, or with rho auto its own
    # rho auto only: why it is what it is (budget.Choice): the objective, its share of the
    # positive importance, that over its predicted ratio, and the objective's best selection
    # of another deepest tensor (budget.Selected's fields)
    objective: Optional[str] = None
    importance_share: Optional[float] = None
    rate: Optional[float] = None
    runner_up: Optional[dict] = None
    # --pace_check: what the check at the end of its interval found (trend.paced's record:
    # the mean loss drop of full training's and its steps, its step ratio, behind or not)
    pace: Optional[dict] = None

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Correction:
    """One closed-loop correction (summary.json "corrections")."""
    step: int
    measured_ratio: float
    miss: str
    predicted_ratio_before: float
    dw_scale: float
    dy_scale: float
    fixed_ms: float
    selected_before: int
    selected_after: int

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ElasticState:
    """Everything the runtime knows; a checkpoint keeps it (to_dict / from_dict)."""
    next_reselect: float = 0
    settled: bool = False               # every tensor trains to the end, no re-selection
    probing: int = 0                    # probe steps still to run in this re-selection
    probe_terms: Optional[List[float]] = None
    probe_s: float = 0.0                # ... and the seconds its probes and checks took
    probes_run: int = 0                 # probe steps so far
    importance: Optional[List[float]] = None
    # rho auto: the step ratio cheaper selections are widened to, since one whose loss did not
    # fall (budget.py, widened)
    min_ratio: float = 0.0
    start_loss: Optional[float] = None  # where the first judged selection's loss began (trend)
    selection: Optional[List[int]] = None
    mask: Optional[List[bool]] = None
    records: List[dict] = dataclasses.field(default_factory=list)
    record_open: bool = False
    corrections: List[dict] = dataclasses.field(default_factory=list)
    times: List[float] = dataclasses.field(default_factory=list)       # selection steps (s)
    full_times: List[float] = dataclasses.field(default_factory=list)  # timed full steps (s)
    first_step_s: Optional[float] = None  # the selection's first step (may compile)
    first_compiled: bool = True         # ... and whether it did (its step was new)
    first_window: int = 0
    # a resumed process runs the selection's step for the first time: its next step compiles
    recompile: bool = False
    corrections_here: int = 0
    was_over: bool = False
    rounds: int = 1                     # rounds the open window is judged on
    win_t: int = 0                      # the window: times[win_t:], full_times[win_f:]
    win_f: int = 0
    measuring: bool = True
    readout: bool = False               # the open window only reads the ratio out (economy.py)
    measured: List[list] = dataclasses.field(default_factory=list)  # [selection, ratio]
    windows: List[list] = dataclasses.field(default_factory=lambda: [[0.0, None]])
    overhead_parts: dict = dataclasses.field(
        default_factory=lambda: dict.fromkeys(OVERHEAD_PARTS, 0.0))
    fill_steps: int = 0                 # selection steps that filled the prefix cache
    fill_s: float = 0.0                 # ... and the seconds they spent storing images
    step_s: float = 0.0                 # selections' own steps of closed records
    full_s: float = 0.0                 # what full training would spend on them, probes' and
                                        # timed full steps' batches included
    full_compile_s: Optional[float] = None  # the full step's first-call excess
    profiling_s: float = 0.0            # profiling the timing table in this run (accounting.py)
    selection_compile_s: Optional[float] = None  # the latest selection step's
    controller: dict = dataclasses.field(default_factory=dict)
    economy: dict = dataclasses.field(default_factory=dict)  # economy.Economy.state()
    warmup_left: int = 0                # head warm-up steps still to train (runtime.py)
    warmup_steps: int = 0               # ... and the warm-up's length, once it started
    # measurements whose miss was still to be confirmed when their selection stopped training
    # (a re-selection, or the run's end, came first: closed_loop.py)
    unconfirmed: int = 0
    # the current selection's step losses since its interval began, as trend.py buckets
    losses: List[list] = dataclasses.field(default_factory=list)
    # the pace check's words on the current selection, from its check to the solve (judge.py)
    paced: Optional[str] = None
    version: int = STATE_VERSION

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        """A state from a checkpoint; a newer layout than this code knows is refused."""
        data = dict(data)
        version = data.get("version", 1)
        if version > STATE_VERSION:
            raise ValueError(f"elastic state version {version} is newer than this ElasticTrainer "
                             f"reads ({STATE_VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        data["version"] = STATE_VERSION
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclasses.dataclass
class Plan:
    """What the runtime said about the run at its start (also in summary.json "plan").
    corrected: the time model is the one this run's measurements corrected before it was
    resumed (its floor then differs from the fresh start's, and says why); profiling_s: what
    this run spent profiling its timing table first, and saves_at_most_s what its steps would
    save at the forward floor, which no selection beats: a run whose profiling outweighs that
    ends slower than full training, whatever it selects, and is told so."""
    total_steps: int
    forward_floor: float
    affordable_tensors: int
    num_tensors: int
    near_floor: bool
    corrected: bool = False
    profiling_s: float = 0.0
    saves_at_most_s: Optional[float] = None

    def lines(self, rho, margin, uncached_floor=None):
        """What the run says of it at the start (rho: the budget as text, budget.Budget.text;
        uncached_floor: the forward floor without the prefix cache, when one is planned)."""
        cached = ("" if uncached_floor is None else
                  f" with the prefix cached, {uncached_floor:.2f} without")
        corrected = (", under the time model as this run's measurements corrected it"
                     if self.corrected else "")
        affords = (f"rho {rho}: each re-selection trains the cheapest selection that keeps it"
                   if rho.startswith("auto") else
                   f"rho {rho} affords up to {self.affordable_tensors} of {self.num_tensors} "
                   f"tensors under the time model")
        yield (f"elastic: forward floor {self.forward_floor:.2f} of a full step (training "
               f"nothing{cached}){corrected}; {affords}")
        if self.saves_at_most_s is not None and self.profiling_s > self.saves_at_most_s:
            yield (f"elastic: profiling the timing table took {self.profiling_s:.1f} s, more "
                   f"than the {self.total_steps} steps can save (about "
                   f"{self.saves_at_most_s:.1f} s even at the forward floor): this run ends "
                   f"slower than full training; the next run of this model and batch shape "
                   f"reads the table")
        if self.near_floor:
            yield (f"warning: rho {rho} is within {margin:g} of the forward floor "
                   f"({self.forward_floor:.2f}): few tensors fit, expect the accuracy of "
                   f"training little more than the head")


@dataclasses.dataclass(frozen=True)
class EndResult:
    """What an elastic run ends with (ElasticRuntime.finish).  measured_ratio: the selections'
    step-weighted measured step ratio, None when none was measured; estimated_ratio: the time
    model's, weighted alike, which stands in for it then; the re-selection overhead and its
    parts; wall_ratio (accounting.py) and profiling_s, the seconds this run spent profiling
    its timing table, which wall_ratio counts against it, and profiling_in_train_time, whether
    the driver's training time already holds them (model.fit profiles on its first batch, the
    command line before its loop); economy: what the economy chose and why (economy.py);
    closing: the closing line's words on all of it, one line."""
    measured_ratio: Optional[float]
    estimated_ratio: Optional[float]
    reselection_overhead_s: float
    reselection_overhead_parts_s: dict
    wall_ratio: Optional[float]
    economy: dict
    closing: str
    profiling_s: float = 0.0
    profiling_in_train_time: bool = False

    def summary_fields(self):
        """summary.json's fields (runlog.RunSummary) from this result."""
        return {"measured_ratio": self.measured_ratio, "estimated_ratio": self.estimated_ratio,
                "reselection_overhead_s": self.reselection_overhead_s,
                "reselection_overhead_parts_s": dict(self.reselection_overhead_parts_s),
                "wall_ratio": self.wall_ratio, "profiling_s": self.profiling_s,
                "profiling_in_train_time": self.profiling_in_train_time,
                "economy": dict(self.economy)}
