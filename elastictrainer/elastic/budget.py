"""What each selection may cost: a step-time ratio rho the user asked for (eq. 3, the paper's),
or `--rho auto` (not in the paper): each re-selection takes the cheapest selection that keeps
a share of the estimated loss drop (method/cheapest.py, the dual of eq. 3, solved as exactly),
and the ratio that selection amounts to becomes the closed loop's target until the next one.

Why: rho is a guess the user has to make.  Too high spends time on tensors that bring little;
too low leaves out tensors that matter (a short, small-image run at rho 0.5 ended 5.9 points
under full training).  The share asks instead how much of what training every tensor would
bring a run keeps, which the importance estimate (eq. 4-6) answers at every re-selection, so
the budget follows the run: large while much is to gain deep in the model, small once the head
alone carries the loss drop.  Plain Python.
"""
import numpy as np

AUTO = "auto"
# --rho_share's default: the share that came within 1 point of full training's best on every
# configuration of the time-to-accuracy benchmark that has a yardstick (README command 1 over
# five seeds, smallcnn at 32 px, a pretrained Keras 3 CNN in model.fit); 0.5 was faster on
# command 1 but ended 2.9 points under at 32 px (docs/performance.md)
DEFAULT_SHARE = 0.7


def parse_rho(value):
    """A rho setting: a number, or "auto" (any case)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return float(value)


class Budget:
    """rho: the requested step-time ratio, or AUTO; share: with AUTO, the share of the positive
    importance (the estimated loss drop) each selection keeps."""

    def __init__(self, rho, share=DEFAULT_SHARE):
        self.auto = parse_rho(rho) == AUTO
        self.share = float(share)
        if self.auto and not 0 < self.share <= 1:
            raise ValueError(f"the share of rho auto must be in (0, 1], got {share}")
        self.rho = None if self.auto else float(rho)

    @property
    def text(self):
        """The budget in a line: "0.5", or "auto (90% of the estimated loss drop)"."""
        return (f"{AUTO} ({self.share:.0%} of the estimated loss drop)" if self.auto
                else f"{self.rho:g}")

    def solve(self, model, importance, resolution):
        """(mask, the ratio it is solved for): eq. 3 under rho, or the cheapest selection
        keeping the share, whose predicted ratio is then the target."""
        if not self.auto:
            return model.select(importance, self.rho, resolution=resolution), self.rho
        mask = model.select_share(np.asarray(importance, float), self.share,
                                  resolution=resolution)
        return mask, model.predicted_ratio(mask)

    def fallback(self, cheapest, importance, previous, n, log):
        """What trains when the solution is empty: the previous selection when no tensor has
        positive importance, else the output-most (cheapest) tensor, `cheapest`; said in one
        line."""
        mask = np.zeros(n, bool)
        if not np.any(importance > 0) and previous is not None:
            mask[list(previous)] = True
            log(f"no tensor has positive importance; keeping the previous selection "
                f"({len(previous)} tensors)")
            return mask
        mask[list(cheapest)] = True
        log("no tensor has positive importance; training the output-most tensor only"
            if not np.any(importance > 0) else
            f"no tensor worth training fits rho {self.text} under this time model; training "
            f"the output-most (cheapest) tensor only")
        return mask
