"""The elastic runtime's accounting: where each second of a run goes.

Wall-clock accounting.  A run's training time T is the loop's own work L (next batch,
bookkeeping, logging, the full step's one compile) plus the selections' own steps S, plus the
probe and timed full steps G (every tensor's backward pass without the update: they train
nothing), plus compiling each selection's step C, plus solving and out-of-step importance
probes P.  Full training of the same steps would take L + S/r (each measurement window's steps
over the ratio r measured in it) + G x full_over_grads (their batches trained at a full step's
cost).  `wall_ratio` is T over that; the re-selection overhead is C + P + G: what the elastic
run spends beyond training its selections.  Selection steps that store images in the
prefix cache (--cache_frozen_prefix) train their batches at more than a cached step's cost:
they are booked apart from the windows the closed loop measures, and full training would have
spent a full step on each.
"""
import statistics


class Accounting:
    """The bookkeeping half of ElasticRuntime (which it is mixed into): state `self.s`
    (ElasticState), `self.events`, the overhead parts, and the run-level numbers of finish()."""

    def _emit(self, tag, value, step):
        self.events.append((tag, value, int(step)))

    def _overhead(self, part, seconds):
        self.s.overhead_parts[part] += seconds

    @property
    def overhead_s(self):
        return sum(self.s.overhead_parts.values())

    @property
    def selection(self):
        return None if self.s.selection is None else tuple(self.s.selection)

    def _book_fill(self, seconds):
        """A selection step that filled the prefix cache: it trains its batch, dearer than
        the cached steps the selection was priced for, so it is booked apart from the closed
        loop's measurements.  False: the selection stays."""
        s = self.s
        s.fill_steps += 1
        s.fill_s += seconds
        rec = s.records[-1]
        rec["steps"] += 1
        rec["fill_steps"] = rec.get("fill_steps", 0) + 1  # records of older checkpoints lack it
        return False

    def _remember(self, selection, measured):
        key = [int(k) for k in selection]
        self.s.measured = [m for m in self.s.measured if m[0] != key] + [[key, measured]]

    def _full_ms(self):
        return statistics.median(self.s.full_times) * 1e3 if self.s.full_times else None

    def _measured(self):
        """The current window's median step over its median full step."""
        s = self.s
        times, full = s.times[s.win_t:], s.full_times[s.win_f:]
        if not times or not full:
            return None
        return statistics.median(times) / statistics.median(full)

    def _close_record(self):
        """Final numbers of the selection that stops training now: its median step, its
        measured ratio (its windows' own seconds over what full training would have spent on
        them, _full_seconds), and the compile its first step paid."""
        s = self.s
        if not s.record_open:
            return
        rec = s.records[-1]
        everything = all(s.mask)
        if s.times:
            median = statistics.median(s.times)
            rec["step_ms"] = median * 1e3
            if s.first_step_s is not None and not everything:
                compiling = max(s.first_step_s - median, 0.0)
                self._overhead("compiling", compiling)
                s.windows[s.first_window][0] -= compiling
        elif s.first_step_s is not None and everything:
            rec["step_ms"] = s.first_step_s * 1e3
        if s.windows[-1][1] is None:  # a window still open: what it has measured so far
            s.windows[-1][1] = self._measured()
        own = sum(seconds for seconds, _ in s.windows)
        full = self._full_seconds()
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

    def _full_seconds(self):
        """What full training would have spent on this selection's own steps: each window's
        steps over the ratio measured in that window, whose full steps ran among them (a load
        of one moment slows both alike); a window not judged takes the nearest judged one's
        ratio; None if no window measured anything."""
        known = [r for _, r in self.s.windows if r]
        if not known:
            return None
        total, ratio = 0.0, known[0]
        for seconds, measured in self.s.windows:
            ratio = measured or ratio
            total += seconds / ratio
        return total

    def measured_so_far(self):
        """The selections' step-weighted measured ratio so far, closing nothing (None before
        any measurement): what a run reports while it goes on."""
        return _weighted_ratio(self.s.records)

    def finish(self, train_time_s):
        """Run-level numbers for summary.json: the selections' step-weighted measured ratio,
        the re-selection overhead and its parts, and wall_ratio (module doc)."""
        s = self.s
        s.probing = 0  # a run may end inside a re-selection: its probes are booked already
        self._close_record()
        # steps that filled the prefix cache trained their batches: full training would
        # have spent a full step on each
        fill_full_s = s.fill_steps * self._t_full_s() if s.fill_steps else 0.0
        return {
            "measured_ratio": _weighted_ratio(s.records),
            "reselection_overhead_s": self.overhead_s,
            "reselection_overhead_parts_s": dict(s.overhead_parts),
            "wall_ratio": wall_ratio(train_time_s, s.step_s + s.fill_s, self.overhead_s,
                                     s.full_s + fill_full_s),
        }



def _weighted_ratio(records):
    """The selections' measured ratios weighted by their steps, steps that filled the prefix
    cache left out (the ratio is their cached steps'); None before any measurement."""
    def steps(r):
        return r["steps"] - r.get("fill_steps", 0)

    done = [r for r in records if r["measured_ratio"] is not None and steps(r)]
    weight = sum(steps(r) for r in done)
    return sum(r["measured_ratio"] * steps(r) for r in done) / weight if weight else None


def wall_ratio(train_time_s, step_s, overhead_s, full_s):
    """train_time_s / (loop work + full_s), loop work = train_time_s - step_s - overhead_s
    (the module doc's L); None without a measured full step."""
    if not full_s > 0:
        return None
    loop_s = max(train_time_s - step_s - overhead_s, 0.0)
    return train_time_s / (loop_s + full_s)
