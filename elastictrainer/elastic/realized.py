"""The estimated loss drop corrected by what a step realizes, depth by depth (--trial_check; not
in the paper, which trusts eq. 4-6).

At each re-selection the probes give every tensor's estimated loss drop (eq. 4-6); before the
selection is solved (eq. 3), the tensors are split by depth into GROUPS runs of equal count, and
the trainer's trial step (method/trial.py) measures for each group what one step of its tensors
(as long as momentum makes a steady one) realizes on the probes' batches (summed over them)
against what the first-order estimate predicts for it.  Every
positive estimate in a group is scaled by its group's realized share, so that:

- within a depth the estimate's ranking stands (the group's tensors are scaled alike);
- across depths the estimate is held to what a step brings: a group whose step realizes a
  small share of its promise (large, noisy gradients whose step overshoots) loses its weight,
  one whose step raises the loss (a negative share) leaves the selection.

The shares scale the estimate as a whole, so their common level does not matter (the
estimate is normalised, eq. 4-6's max |I|), only how they differ by depth.  They tell depths
apart only where the step lies within the first-order estimate's reach for some depth: when no
group realizes SUFFICIENT of its promise, every depth overshoots, and the shares are noise about
zero (from the importance benchmark's state on EfficientNet-Lite0 on textures, -6% to +5%).
The check then backtracks, as a line search does, to the plain step (one step of the optimizer
from a fresh state) on the same batches, and scales by its shares.  A group whose estimate is
not positive keeps its estimate; when no group realizes anything (the held-out
loss rose for all), the estimate is left as it is and the run says so.

Plain Python (numpy), no TensorFlow.
"""
import numpy as np

# The depth groups a trial step measures: one forward pass each (and one for the loss before).
# Fewer groups mix depths whose shares differ; more leave each group's share to fewer tensors'
# noise.  With 16, the checked estimate ranks tensors by the truth at +0.82 and +0.94 across
# the nested and the flat domain shift (figures/bench_importance_truth.md)
GROUPS = 16
# The share of its first-order promise that some depth group's trial step must realize for the
# shares to compare depths; under it the check backtracks to the plain step.  Half: across the
# domain shifts the momentum-long step's best groups realized 94-99%, on textures 5% (all
# overshooting; the plain step's 38%), from the importance benchmark's states
SUFFICIENT = 0.5


def groups(n, parts=GROUPS):
    """`n` tensor indices (model order, the input first) split into at most `parts` runs of
    nearly equal count."""
    bounds = np.linspace(0, n, min(parts, n) + 1).round().astype(int)
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def masks(n, parts=GROUPS):
    """The groups as 0/1 masks over the `n` tensors (what the trial step takes)."""
    out = []
    for group in groups(n, parts):
        mask = [0] * n
        for k in group:
            mask[k] = 1
        out.append(mask)
    return out


def correct(importance, measured, parts=GROUPS):
    """(corrected importance, shares, words): `importance` with each group's positive entries
    scaled by realized / predicted of its trial (`measured`: [(predicted, realized)] per group,
    as groups() splits them); shares: those ratios (None where the prediction was not
    positive); words: the line the run logs."""
    importance = np.asarray(importance, float)
    parts_ = groups(len(importance), parts)
    shares = [None if predicted <= 0 else realized / predicted
              for predicted, realized in measured]
    spans = " | ".join(f"{g[0]}-{g[-1]}" for g in parts_)
    said = " | ".join("-" if r is None else f"{r:+.0%}" for r in shares)
    words = (f"trial step by depth (tensors {spans}): realizes {said} of the first-order "
             f"estimate")
    if not any(r is not None and r > 0 for r in shares):
        return importance, shares, words + "; no depth lowered the loss: estimate kept"
    out = importance.copy()
    for group, share in zip(parts_, shares):
        if share is None:
            continue
        idx = np.asarray(group)
        out[idx] = np.where(importance[idx] > 0, importance[idx] * share, importance[idx])
    return out, shares, words + "; estimate scaled by depth"


def enough(measured):
    """Whether some group of `measured` ([(predicted, realized)] per group) realizes at least
    SUFFICIENT of a positive prediction: the trial step's length for comparing depths."""
    return any(predicted > 0 and realized >= SUFFICIENT * predicted
               for predicted, realized in measured)


def checked(trial, importance):
    """(corrected importance, words) from the trial step (`trial(masks, enough)` -> (pairs or
    None when it holds no probe batch, whether they are the plain step's)); (importance, None)
    when there is no trial to go by."""
    measured, plain = trial(masks(len(importance)), enough)
    if measured is None:
        return np.asarray(importance, float), None
    corrected, _, words = correct(importance, measured)
    if plain:
        words = (f"{words} (the plain step's: the momentum-long one realized under "
                 f"{SUFFICIENT:.0%} of its promise at every depth)")
    return corrected, words


def check(trial, importance, log):
    """The estimate corrected by the trial step (checked), normalised as eq. 4-6's is;
    `importance` as it is when there is no trial to go by."""
    corrected, words = checked(trial, importance)
    if words is None:
        return corrected
    log(f"elastic: {words}")
    top = float(np.max(np.abs(corrected))) if len(corrected) else 0.0
    return corrected / top if top > 0 else corrected
