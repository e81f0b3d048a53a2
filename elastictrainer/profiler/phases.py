"""Where profiling's seconds go: the Phases ledger profile_model and the profiling child keep,
and the one line a run that profiles first logs from it.  No TensorFlow."""
import time


class Phases:
    """mark(name) books the time since the last mark (or since the ledger was made) under
    `name`, added up when a name repeats; `seconds` keeps them in order of first booking."""

    def __init__(self, clock=time.perf_counter):
        self.clock, self.seconds = clock, {}
        self._last = clock()

    def mark(self, name):
        now = self.clock()
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._last)
        self._last = now

    def split(self, name, parts):
        """Book `name`'s seconds as `parts` (a nested ledger's seconds), keeping what they
        leave out as `<name>_other`."""
        rest = self.seconds.pop(name) - sum(parts.values())
        self.seconds.update(parts)
        self.seconds[f"{name}_other"] = rest


def phases_text(phases, where):
    """One line: how long profiling took `where` ("in this process", ...) and on what, largest
    first; phases under 0.05 s are left out of the list, not of the total."""
    if not phases:
        return f"profiled {where}"
    parts = ", ".join(f"{name.replace('_', ' ')} {s:.1f} s"
                      for name, s in sorted(phases.items(), key=lambda kv: -kv[1]) if s >= 0.05)
    return f"profiled {where} in {sum(phases.values()):.1f} s: {parts}"
