"""Whether a selection pays (not in the paper): in training loss, the losses of its steps kept
in a few buckets and the rule that says whether they fell; and in the estimated loss drop.

The paper re-selects every interval whatever happens; the economy (economy.py) may keep a
selection to hold re-selection overhead within its budget.  Keeping one is right only while it
trains: a selection whose loss does not fall (importance measured on a randomly initialised
head, say, picks tensors that do not lower it) costs the run every step it is kept, so the
runtime (runtime.py) replaces it at the next interval whatever the budget says (under rho
auto by a wider one while its loss is still high, failing: budget.py).

The rule, and why: the mean loss of the last third of the selection's steps must lie at least
FALL_MARGIN (relative) below the mean of the first third.  Single batch losses vary by far
more than an interval's trend, so thirds of many steps are compared rather than ends; the
middle third is left out so that the two means lie an interval's third apart; the margin is
relative so that it means the same for any loss scale, and small, because keeping a slow
learner costs less than a re-selection that should not have happened.  Fewer than MIN_STEPS
steps are not judged (the selection counts as paying, as without this rule).

A selection also stops paying when its tensors' gradients are trained away while its loss
still falls: the probes then find the estimated loss drop (eq. 4-6) elsewhere, and each of its
steps brings less than what the probes' choice would.  When the kept selection holds less than
FADED of the share of the estimated loss drop the probes' choice holds, a compile is worth
paying whatever the overhead budget says (the run replaced for that reason says so).

A selection whose loss falls, but more slowly per second than full training's would, is
behind (--pace_check, pace.py): `behind` is the paired test on what both brought from the same
weights on the same batches, and a selection behind is failing as one whose loss did not fall.

Plain Python (numpy), no TensorFlow; the buckets ([loss sum, steps]) are plain data in the runtime's
checkpointed state (state.ElasticState.losses).
"""
import math

import numpy as np

# A selection's loss must fall by this share between its first and last thirds of steps.
FALL_MARGIN = 0.02
# Steps a selection must have trained to be judged (at least four per third).
MIN_STEPS = 12
# The kept selection's share of the estimated loss drop, against the probes' choice's, under
# which it is replaced past the budget (faded)
FADED = 0.5
# A selection whose loss did not fall is failing (under rho auto the run widens, budget.py)
# only while its loss is above this share of where the run's first judged selection began;
# under it the run is converging: on the nested domain shift (docs/performance.md) auto's
# selections stalled at training losses of 0.03-0.07, their test accuracy still climbing,
# where widening would only slow the run's second half
CONVERGED = 0.5
# Buckets an interval's losses take at most (bounded checkpoints whatever the interval's length).
BUCKETS = 48


def bucket_steps(every):
    """Steps per bucket for re-selections `every` steps apart."""
    return max(1, int(every) // BUCKETS)


def add(buckets, loss, size):
    """Book one step's loss into `buckets` (in place); a loss that is not finite is left out."""
    loss = float(loss)
    if not math.isfinite(loss):
        return
    if buckets and buckets[-1][1] < size:
        buckets[-1][0] += loss
        buckets[-1][1] += 1
    else:
        buckets.append([loss, 1])


def judge(buckets):
    """(first third's mean, last third's mean, steps), None when too few steps to judge."""
    steps = sum(count for _, count in buckets)
    third = len(buckets) // 3
    if steps < MIN_STEPS or third < 1:
        return None

    def mean(part):
        return sum(total for total, _ in part) / sum(count for _, count in part)

    return mean(buckets[:third]), mean(buckets[-third:]), steps


def verdict(judged):
    """(stalled, words): whether the loss did not fall (module doc's rule), and the trend in
    words, from `judged` (judge's answer); (False, None) when the selection has too few steps
    to judge (None)."""
    if judged is None:
        return False, None
    first, last, steps = judged
    words = f"training loss {first:.4g} -> {last:.4g} over the selection's last {steps} steps"
    if first - last > FALL_MARGIN * abs(first):
        return False, words
    return True, f"{words}, not {FALL_MARGIN:.0%} lower"


def failing(judged, start):
    """Whether a selection whose loss did not fall (verdict, on the same `judged`) is failing
    rather than done: its last third's mean loss still above CONVERGED of `start`, the mean
    loss the run's first judged selection began at (None: not known yet, so not failing)."""
    return judged is not None and start is not None and judged[1] > CONVERGED * start


def faded(kept, chosen, importance):
    """Words when selection `kept` holds less than FADED of the share of the estimated loss
    drop (the positive part of `importance`, just probed) that selection `chosen` holds, else
    None."""
    gain = np.clip(np.asarray(importance, float), 0.0, None)
    total = float(gain.sum())
    if total <= 0:
        return None
    old, new = (float(gain[list(sel)].sum()) / total for sel in (kept, chosen))
    if old >= FADED * new:
        return None
    return f"the selection keeps {old:.0%} of the estimated loss drop, the probes' choice {new:.0%}"


# Fewer held batches are not judged (too few to tell a pace from the batches' spread)
PACE_MIN_BATCHES = 4
# Standard errors by which full training's per-second drop must exceed the selection's: about
# Student's t at the 95th percentile for 7 degrees of freedom (1.89), rounded up
PACE_T = 2.0


def behind(full, selection, ratio):
    """(behind, words), --pace_check's rule (pace.py): whether a selection's loss drops per
    second (`selection`, one per batch, its step `ratio` of a full step) fall clearly short of
    full training's (`full`), and the words of the line that says so."""
    full, selection = np.asarray(full, float), np.asarray(selection, float)
    n = len(full)
    if n < PACE_MIN_BATCHES or ratio is None or ratio <= 0:
        return False, None
    d = full - selection / ratio
    se = d.std(ddof=1) / np.sqrt(n)
    words = (f"over {n} batches, a full step lowered the loss by {full.mean():.4f} and this "
             f"selection's by {selection.mean():.4f} at {ratio:.3f} of its time")
    return bool(d.mean() > PACE_T * se and d.mean() > 0), words


def paced(compare, selection, ratio, clock, log, global_step):
    """(words, seconds, found): run the pace check (`compare`, pace.PaceCheck.compare) on
    `selection`, whose step takes `ratio` of a full step, and say its answer in one line; the
    words a selection behind is replaced with (None when it keeps up or was not compared), the
    seconds the check took, and what it found for the selection's record (None: not
    compared)."""
    t0 = clock()
    drops = compare(tuple(selection))
    spent = clock() - t0
    if drops is None:
        return None, spent, None
    slow, words = behind(drops[0], drops[1], ratio)
    log(f"elastic: step {global_step}: pace check ({spent:.1f} s): {words}: "
        f"{'behind full training' if slow else 'keeping up'}")
    found = {"step": int(global_step), "batches": len(drops[0]),
             "full_drop": float(np.mean(drops[0])), "drop": float(np.mean(drops[1])),
             "ratio": float(ratio), "behind": bool(slow), "seconds": float(spent)}
    return (f"it trains more slowly than full training ({words})" if slow else None), spent, found
