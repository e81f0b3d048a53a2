"""The head warm-up (not in the paper; --head_warmup): before the first probes, a newly
initialised classifier head trains alone, so that importance (eq. 4-6) is not measured through
it while it is random, as linear-probe-then-fine-tune practice knows.

It is a selection of its own (the head's compiled step), booked like any other by
accounting.py and left unmeasured: the closed loop judges selections of eq. 3, and these
steps are few.  It lasts a share of the first interval.  First probes that still choose the
head alone (or part of it) because it holds the share of the estimated loss drop by itself
(--rho_share: the share objective's reason to choose it) show that it is still untrained and
that the backbone is still measured through it: the warm-up then goes on for another round
of the same steps and the probes follow again, while the warm-up stays within the first
interval.  Without it, an interval too short for the head makes the head alone the first
selection, a cheap one that the economy then prices every later re-selection against, and the
run trains the head alone to its end.  A head chosen for another reason (the rate
objective's: its loss drop per second, with less than the share) is the objective's answer,
not an untrained head's, and is the first selection.

Plain Python (numpy); its state is the runtime's (state.ElasticState: warmup_left,
warmup_steps, next_reselect).
"""
import math

import numpy as np

from elastictrainer.elastic.state import HEAD_WARMUP


class HeadWarmup:
    """head: the head's tensor indices; part: the share of the first interval one round lasts
    (--head_warmup, resolved); n: the model's tensors; first_interval: the steps the warm-up
    stays within; share: the share of the estimated loss drop that, held by the head alone,
    extends it; loop: the runtime's ClosedLoop, which opens the warm-up's selection;
    log(message).  A head that is the whole model (or none) has nothing to warm up for: 0
    steps."""

    def __init__(self, head, part, n, first_interval, share, loop, log):
        self.head = tuple(sorted(int(k) for k in head))
        whole = not self.head or len(set(self.head)) >= n
        self.steps = 0 if whole else math.ceil(part * first_interval)
        self.share = float(share)
        self.first_interval = int(first_interval)
        self._mask = np.asarray([k in self.head for k in range(n)], bool)
        self._loop = loop
        self.log = log

    def open(self, s, global_step):
        """Open the warm-up at a fresh run's `global_step`: the head alone for its steps."""
        s.warmup_left = s.warmup_steps = self.steps
        self._loop.open(s, global_step, self._mask, None, HEAD_WARMUP, measure=False)
        self.log(f"elastic: head warm-up: the classifier head ({len(self.head)} tensors) trains "
                 f"alone for {self.steps} steps before the first probes, so that importance "
                 f"is not measured through an untrained head")

    def goes_on(self, s, global_step, selection):
        """Whether the first probes' choice `selection` (tensor indices), made on s.importance,
        extends the warm-up by another round: it lies within the head, which holds at least
        `share` of the estimated loss drop (module doc); if so it is opened and said."""
        if (not self.steps or not set(selection) <= set(self.head)
                or s.warmup_steps + self.steps > self.first_interval):
            return False
        gain = np.clip(np.asarray(s.importance, float), 0.0, None)
        share = float(gain[self._mask].sum() / gain.sum()) if gain.sum() > 0 else 1.0
        if share < self.share:
            return False
        # the warm-up's probes choose no selection: the next probes are still the first
        # (economy.Progress.selected), and the schedule still counts from a fresh run's step 0
        s.importance, s.next_reselect = None, 0
        s.warmup_left = self.steps
        s.warmup_steps += self.steps
        self._loop.open(s, global_step, self._mask, None, HEAD_WARMUP, measure=False)
        self.log(f"elastic: step {global_step}: the probes find {share:.0%} of the estimated "
                 f"loss drop in the classifier head alone: its warm-up goes on for "
                 f"{self.steps} more steps before the next probes")
        return True

    def step_done(self, s, global_step):
        """Book one warm-up step (the runtime books its time); says when the warm-up ends."""
        s.warmup_left -= 1
        if not s.warmup_left:
            self.log(f"elastic: head warm-up: {s.warmup_steps} steps done at step "
                     f"{global_step}; the first probes follow")
