"""How a run stops early: Ctrl-C asks the loop to stop after the current step (StopFlag), so a
run is never killed mid-write; and a testing hook that kills the process at a chosen step, as a
power cut would, so resume is tested at a known step rather than at a moment."""
import os
import signal

# A testing hook, not a setting: see fault_at_step.
FAULT_AT_STEP_ENV = "ELASTICTRAINER_FAULT_AT_STEP"


def fault_at_step():
    """Testing hook: the global step before which the training process kills itself, or None.

    $ELASTICTRAINER_FAULT_AT_STEP=N makes the loop send itself SIGKILL as it is about to run
    global step N (counted from 0, so after N steps have run), as a power cut or the kernel's
    OOM killer would: nothing is flushed or saved.  The resume tests use it to interrupt a run
    at a known step instead of at a moment.  Unset or empty: no fault.  Read once per run, here.
    """
    value = os.environ.get(FAULT_AT_STEP_ENV, "").strip()
    return int(value) if value else None


def inject_fault(global_step, fault_step):
    """SIGKILL this process when `global_step` is the fault_at_step() step (testing hook)."""
    if fault_step is not None and global_step == fault_step:
        os.kill(os.getpid(), signal.SIGKILL)



class StopFlag:
    """Ctrl-C asks the loop to stop after the current step instead of killing it mid-write."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C stops at once
                raise KeyboardInterrupt
            self.requested = True
        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False
