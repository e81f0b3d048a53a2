"""The elastic runtime's accounting: where each second of a run goes.

Wall-clock accounting.  A run's training time T is the loop's own work L (next batch,
bookkeeping, logging, the full step's one compile) plus the selections' own steps S, plus the
probe and timed full steps G (every tensor's backward pass without the update: they train
nothing), plus compiling each selection's step C, plus solving and out-of-step importance
probes P.  Full training of the same steps would take L + S/r (each measurement window's steps
over the ratio r measured in it) + G x full_over_grads (their batches trained at a full step's
cost).  `wall_ratio` is T over that; the re-selection overhead is C + P + G: what the elastic
run spends beyond training its selections.  A run that profiles its timing table first (none
on disk, none profiled in the process) spends Q more, which full training never does: the
paper's profiling is offline, but the user waits for it all the same.  Q counts on the elastic
side, in T (model.fit profiles on its first batch, inside the epoch's clock) or added to it
(the command line profiles before its loop), and never in L.

A selection step that stores images in the prefix cache (--cache_frozen_prefix) runs their
prefix, stores the rows, then runs the cached step a served batch runs: the storing is booked
apart (fill seconds, F, in T and not in S; full training has no such work), the rest as one
of the selection's steps, which the closed loop measures like any other.

Functions of the runtime's state (state.ElasticState), which they read and book into; the
runtime (runtime.py) calls them.
"""
import statistics

from elastictrainer.elastic.economy import Progress
from elastictrainer.elastic.state import HEAD_WARMUP


def book_overhead(s, part, seconds):
    s.overhead_parts[part] += seconds


def overhead_s(s):
    """The re-selection overhead booked so far."""
    return sum(s.overhead_parts.values())


def book_fill(s, seconds):
    """The storing part of a selection step that filled the prefix cache: its prefix on the
    images it stored, and their rows written (the step's rest is booked as a selection step)."""
    s.fill_steps += 1
    s.fill_s += seconds
    rec = s.records[-1]
    rec["fill_steps"] = rec.get("fill_steps", 0) + 1  # records of older checkpoints lack it


def book_full(s, seconds, compiled, probe, table):
    """A probe or timed full step: every tensor's backward pass, no update.  It trains nothing,
    so all its seconds are overhead; full training would have trained its batch at a full
    step's cost, its seconds times the table's full_over_grads (the update's share of a step;
    `table`: the run's TimeModel).  `compiled`: its first call, whose excess over a typical one
    (the median so far, else the table's) is the full step's compile, which full training pays
    too."""
    over = table.full_over_grads
    if compiled:
        typical = (statistics.median(s.full_times) / over if s.full_times
                   else table.t_full / 1e3 / over)
        s.full_compile_s = max(seconds - typical, 0.0)
        seconds -= s.full_compile_s
    s.full_s += seconds * over
    if probe:
        book_overhead(s, "importance", seconds)
        s.probe_s += seconds
    else:
        book_overhead(s, "timing full steps", seconds)
        s.full_times.append(seconds * over)
        if s.record_open:
            s.records[-1]["full_steps"] += 1


def book_selection_step(s, seconds, compiled, prices=True):
    """One step of the current selection, in its record and window; True for its first
    (which may include compiling its step: kept apart, and the compile taken from it once a
    second step shows a typical one).  prices: whether that compile prices the run's next
    switches (not the head warm-up's: a head alone compiles faster than a selection)."""
    s.records[-1]["steps"] += 1
    s.windows[-1][0] += seconds
    if s.first_step_s is None:
        s.first_step_s, s.first_window = seconds, len(s.windows) - 1
        s.first_compiled = bool(compiled)
        return True
    if s.recompile:
        # a resumed process compiled the step again: timed as a typical step (the median so
        # far), the excess booked as compiling, so the window's ratio is not skewed by it
        s.recompile = False
        typical = statistics.median(s.times) if s.times else seconds
        book_overhead(s, "compiling", max(seconds - typical, 0.0))
        s.windows[-1][0] += typical - seconds
        seconds = typical
    s.times.append(seconds)
    if len(s.times) == 1 and not all(s.mask) and s.first_compiled and prices:
        s.selection_compile_s = max(s.first_step_s - seconds, 0.0)
    return False


def progress(s):
    """The run so far as the books hold it, for the economy (economy.Progress).  The head
    warm-up is no selection of the economy's: its steps and compile are booked, but the
    current ratio and cut are the last selection's, and `selected` waits for the first probes."""
    last = next((r for r in reversed(s.records) if r["reason"] != HEAD_WARMUP), None)
    return Progress(
        full_step_s=statistics.median(s.full_times) if s.full_times else None,
        overhead_s=overhead_s(s) + pending_compile_s(s),
        full_steps=len(s.full_times), probes=s.probes_run,
        selections_compiled=len({tuple(r["mask"]) for r in s.records if not all(r["mask"])}),
        selection_compile_s=s.selection_compile_s,
        current_ratio=None if last is None else last["measured_ratio"] or last["predicted_ratio"],
        current_cut=None if last is None else last.get("cut"),
        selected=s.importance is not None)


def remember(s, selection, measured):
    """Keep `selection`'s latest measured ratio (prefer_measured weighs it later)."""
    key = [int(k) for k in selection]
    s.measured = [m for m in s.measured if m[0] != key] + [[key, measured]]


def full_ms(s):
    """The median timed full step so far, in ms (None before any)."""
    return statistics.median(s.full_times) * 1e3 if s.full_times else None


def window_ratio(s):
    """The current window's median step over its median full step."""
    times, full = s.times[s.win_t:], s.full_times[s.win_f:]
    if not times or not full:
        return None
    return statistics.median(times) / statistics.median(full)


def pending_compile_s(s):
    """The open selection's compile, paid by its first step and booked when it closes."""
    if not (s.record_open and s.times and s.first_compiled and s.first_step_s is not None
            and not all(s.mask)):
        return 0.0
    return max(s.first_step_s - statistics.median(s.times), 0.0)


def close_record(s):
    """Final numbers of the selection that stops training now: its median step, its measured
    ratio (its windows' own seconds over what full training would have spent on them,
    full_seconds), and the compile its first step paid."""
    if not s.record_open:
        return
    if s.measuring and not s.readout and s.rounds > 1:  # a miss it had no steps left to confirm
        s.unconfirmed += 1
    rec = s.records[-1]
    everything = all(s.mask)
    if s.times:
        median = statistics.median(s.times)
        rec["step_ms"] = median * 1e3
        if s.first_step_s is not None and not everything:
            compiling = max(s.first_step_s - median, 0.0)
            book_overhead(s, "compiling", compiling)
            s.windows[s.first_window][0] -= compiling
    elif s.first_step_s is not None and everything:
        rec["step_ms"] = s.first_step_s * 1e3
    if s.windows[-1][1] is None:  # a window still open: what it has measured so far
        s.windows[-1][1] = window_ratio(s)
    own = sum(seconds for seconds, _ in s.windows)
    full = full_seconds(s.windows)
    ratio = rec["predicted_ratio"]
    if full:
        ratio = own / full
        rec["measured_ratio"] = ratio
    else:
        full = own / ratio
    s.step_s += own
    s.full_s += full
    s.windows, s.first_window = [[0.0, None]], 0
    s.record_open = False


def full_seconds(windows):
    """What full training would have spent on a selection's own steps, `windows` [[seconds,
    measured ratio or None]]: each window's steps over the ratio measured in that window, whose
    full steps ran among them (a load of one moment slows both alike); a window not judged
    takes the nearest judged one's ratio; None if no window measured anything."""
    known = [r for _, r in windows if r]
    if not known:
        return None
    total, ratio = 0.0, known[0]
    for seconds, measured in windows:
        ratio = measured or ratio
        total += seconds / ratio
    return total


def measured_so_far(s):
    """The selections' step-weighted measured ratio so far, closing nothing (None before any
    measurement): what a run reports while it goes on."""
    return weighted_ratio(s.records)


def close_run(s, train_time_s, profiled_in_clock):
    """Close the books at the run's end: (measured ratio, estimated ratio, overhead, its parts,
    wall_ratio) (module doc); train_time_s: the driver's training clock, which holds the run's
    profiling when profiled_in_clock."""
    s.probing = 0  # a run may end inside a re-selection: its probes are booked already
    close_record(s)
    spent = overhead_s(s)
    waited_s = train_time_s + (0.0 if profiled_in_clock else s.profiling_s)
    return (weighted_ratio(s.records), weighted_ratio(s.records, "predicted_ratio"), spent,
            dict(s.overhead_parts),
            wall_ratio(waited_s, s.step_s + s.fill_s, spent + s.profiling_s, s.full_s))


def closing_words(rho, measured, estimated, corrections, spent_s, wall, train_time_s,
                  economy_words, full_training=False, unmeasured_why=None, profiling_s=0.0):
    """The closing line's words on an elastic run (rho: the budget as text), one line: the step
    ratio measured (or why none was, and the time model's instead), the wall clock against full
    training's (with the run's profiling, if any), the re-selection overhead and what the
    economy held back; or, for a run the economy made full training, that (economy_words)."""
    profiled = (f", its {profiling_s:.1f} s of profiling the timing table included"
                if profiling_s > 0 else "")
    if full_training:
        return economy_words + (f" (wall clock {wall:.2f} of full training's{profiled})"
                                if profiled and wall is not None else "")
    if measured is not None:
        ratio = (f"step-time ratio asked {rho}, measured {measured:.3f} ({corrections} "
                 f"correction(s))")
    elif estimated is None:
        ratio = f"step-time ratio asked {rho}: no selection trained"
    else:
        why = unmeasured_why or ("the run ended before its selection's steps were timed "
                                 "against full steps")
        ratio = (f"step-time ratio asked {rho}, not measured ({why}), {estimated:.3f} by the "
                 f"time model")
    wall_words = (f"wall clock {'n/a' if wall is None else f'{wall:.2f}'} of full training's, "
                  f"estimated in the run{profiled} (re-selecting {spent_s:.1f} s, "
                  f"{100 * spent_s / max(train_time_s, 1e-9):.0f}% of training)")
    return "; ".join(part for part in (ratio, wall_words, economy_words) if part)


def weighted_ratio(records, key="measured_ratio"):
    """The selections' ratios (`key`) weighted by their steps; None when none has one."""
    done = [r for r in records if r[key] is not None and r["steps"]]
    weight = sum(r["steps"] for r in done)
    return sum(r[key] * r["steps"] for r in done) / weight if weight else None


def wall_ratio(train_time_s, step_s, overhead_s, full_s):
    """train_time_s / (loop work + full_s), loop work = train_time_s - step_s - overhead_s
    (the module doc's L; overhead_s with the run's profiling, if any); None without a measured
    full step."""
    if not full_s > 0:
        return None
    loop_s = max(train_time_s - step_s - overhead_s, 0.0)
    return train_time_s / (loop_s + full_s)
