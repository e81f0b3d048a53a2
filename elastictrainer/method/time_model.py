"""The paper's time model (eq. 3) on a profiled timing table.

A selection whose deepest tensor (from the output back) is d costs
    T(sel) = t_fp + sum_{k in sel} t_dw[k] + sum_{j <= d} t_dy[j]        (ms)
and ElasticTrainer keeps T(sel) <= rho * t_full.  With the frozen prefix cached
(--cache_frozen_prefix, prefix/cache.py; not in the paper) t_fp becomes the forward pass of
the suffix above the cut below d: the timed forward pass less its prefix's share (from the
traced forward op time of the prefix's layers and a FLOP estimate, or the estimate alone for
a table without the former), plus the fixed cost; selector.eq3_parts adds it to eq. 3 as a term
that grows with d.  The per-tensor op times of the table are scaled
so that training everything predicts the measured full step: with the profiler's calibration
(profiler/calibration.py), t_dw and t_dy each by their own fitted scale and t_fp raised by the
fixed cost a partial step pays beyond its ops (fit_fixed_cost), otherwise both by one uniform
scale.  --rho auto's objectives apply the same cost: the cheapest selection keeping a
share of the importance (select_share, cheapest.py), the most importance per ms of the
predicted step time (select_rate, rate.py), or the most importance beyond full training's rate
(select_gain, rate.py).  The cost itself is defined once, in selector.eq3_parts; this module applies it
to tables in model.trainable_weights order.  NumPy only.
"""
import copy
import math

import numpy as np

from elastictrainer.method import cheapest, rate, selector

# A selection "spends" its budget when the time model puts it within this fraction of rho; the
# closed loop (rho_control.py) counts a measured ratio this far from its target as a miss.
TOLERANCE = 0.05
# The least step time, as a share of a full step, any selection is priced at (predicted_ratio,
# and the rate objective's fixed cost): a corrected model's intercept may reach zero or below
# (_intercept_ms), where a cheap selection (the head alone) would be predicted free, the rate
# objective's importance per ms (method/rate.py) would have no bound and time booked against a
# predicted ratio would divide by zero; a real step never takes less than 1% of a full one.
STEP_FLOOR = 0.01
# A cut's prefix is priced by the table's traced forward time per layer only when the model's
# layers hold at least this share of it (a table of a model whose layers are named otherwise
# does not price this one's cuts).
MATCHED_SHARE = 0.5
# The weight of the trace's share in a cut's prefix share, the FLOP estimate's the rest
# (TimeModel.prefix_shares says why both, and what the mean matched).
TRACE_WEIGHT = 0.5


def output_first(rank):
    """Indices of the tensors from the output (rank 0) back to the input."""
    return np.argsort(np.asarray(rank))


def selection_sums(t_dw, t_dy, rank, mask):
    """(sum of t_dw over the selection, sum of t_dy from the output down to its deepest tensor):
    the two terms of eq. 3's backward cost, for arrays in trainable order with each tensor's
    rank (0 = output-most)."""
    o = output_first(rank)
    dw, dy, _ = selector.eq3_parts(np.asarray(t_dw, float)[o], np.asarray(t_dy, float)[o],
                                np.asarray(mask, bool)[o])
    return math.fsum(dw.tolist()), math.fsum(dy.tolist())


def uniform_scale(t_dw, t_dy, t_fp, t_full):
    """The one factor that makes the summed op times of a full selection equal the measured
    backward pass (t_full - t_fp): the time model's scale without calibration."""
    ops = float(np.sum(t_dw) + np.sum(t_dy))
    return (t_full - t_fp) / ops if ops > 0 else 0.0


class TimeModel:
    """Eq. 3 with a table's times, scaled as the module doc says; `cache`, the cut points a
    run may cache its frozen prefix at (prefix/cache.py's PrefixCache.for_time_model), or None."""

    def __init__(self, table, cache=None):
        tensors = table["tensors"]
        self.rank = np.array([t["rank"] for t in tensors])
        self.order = output_first(self.rank)
        t_dw = np.array([t["t_dw_ms"] for t in tensors], float)
        t_dy = np.array([t["t_dy_ms"] for t in tensors], float)
        self.t_fp = float(table["t_fp_ms"])
        self.t_full = float(table["t_full_ms"])
        scale = uniform_scale(t_dw, t_dy, self.t_fp, self.t_full)
        cal = table.get("calibration")
        self.calibrated = bool(cal)
        self.t_dw = t_dw * (cal["dw_scale"] if cal else scale)
        self.t_dy = t_dy * (cal["dy_scale"] if cal else scale)
        # per-step cost beyond the profiled forward pass: the calibration's (fit_fixed_cost),
        # then the closed loop's corrections (rho_control.py)
        self.fixed_ms = float(cal.get("fixed_ms", 0.0)) if cal else 0.0
        self.t_fp += self.fixed_ms
        # full step / the same step without the optimizer's update (>= 1): a run times its
        # full steps without the update (they must not train), so this turns them into full
        # steps; 1 for tables without t_grads_ms (the update's share then counts as nothing)
        grads = table.get("t_grads_ms")
        self.full_over_grads = max(self.t_full / grads, 1.0) if grads else 1.0
        # the trace's forward op time by layer, and in all (what a cut's prefix share is of)
        self.fp_layers_ms = table.get("t_fp_layers_ms") or {}
        self.fp_ops_ms = float(table.get("t_fp_ops_ms") or 0.0)
        self.use_cache(cache, float(table["t_fp_ms"]))

    def prefix_shares(self, cache):
        """Each cut's prefix share of the forward pass: the mean of its layers' share of the
        trace's forward op time and its FLOP estimate (1 - its suffix's FLOP share), when the
        table has the trace's times for this model's layers; the FLOP estimate alone
        otherwise.  FLOPs miss what a cached step skips beyond multiply-adds: the augmenting
        layers (a flip and a rotation, about a tenth of MobileNetV2's forward ops at 96 px,
        batch 8) and the memory-bound work of the early layers at full resolution.  The
        trace's op times, taken inside a training step, overstate the early layers instead:
        on that MobileNetV2, forward passes of the suffix above five cuts, timed against the
        whole forward pass, left out 0.32-0.82 of it where the trace's shares said 0.40-0.84
        (0.44-0.85 on a busier profile) and the FLOPs 0.22-0.80; the mean of the two was
        within 0.02 of every one (TRACE_WEIGHT)."""
        estimated = [1.0 - c["forward_share"] for c in cache["cuts"]]
        layers, total = self.fp_layers_ms, self.fp_ops_ms
        names = cache.get("layers")
        if not layers or total <= 0 or names is None or any(
                "prefix_layers" not in c for c in cache["cuts"]):
            return estimated
        # a table profiled on a model whose layers are named otherwise prices nothing here
        if sum(layers.get(n, 0.0) for n in set(names)) < MATCHED_SHARE * sum(layers.values()):
            return estimated
        traced = [min(sum(layers.get(n, 0.0) for n in set(c["prefix_layers"])) / total, 1.0)
                  for c in cache["cuts"]]
        return [TRACE_WEIGHT * t + (1.0 - TRACE_WEIGHT) * e for t, e in zip(traced, estimated)]

    def use_cache(self, cache, fp_ms):
        """The forward increments by depth (eq3_parts' t_fw, output-first) and what the cut of
        each depth saves of the forward pass (`saved`), from the cuts' prefix shares
        (prefix_shares) of the timed forward pass `fp_ms`."""
        self.cache = cache
        n = len(self.order)
        self.cut_at = np.full(n, -1)
        self.saved = np.zeros(n)
        self.t_fw = None
        if not cache or not cache["cuts"]:
            return
        cut = np.asarray(cache["tensor_cut"], int)[self.order]
        # the cut for depth j must hold every tensor from the output down to j in its suffix
        self.cut_at = np.minimum.accumulate(cut)
        # a cut saves the forward pass below it, less the host work of reading its rows
        saved = np.array([share * fp_ms - c.get("lookup_ms", 0.0)
                          for share, c in zip(self.prefix_shares(cache), cache["cuts"])]
                         + [0.0])
        # a deeper selection never saves more (conservative where reading costs more)
        self.saved = np.minimum.accumulate(np.maximum(saved[self.cut_at], 0.0))
        self.t_fw = np.concatenate([[0.0], self.saved[:-1] - self.saved[1:]])

    def without_cache(self):
        """This model for a run whose cache is off (eq. 3 as the paper has it)."""
        out = copy.copy(self)
        out.use_cache(None, 0.0)
        return out

    @property
    def cached_forward_ms(self):
        """The forward pass of the cheapest selection: the whole forward pass without a cache."""
        return max(self._intercept_ms, 0.0)

    @property
    def _intercept_ms(self):
        """The cheapest selection's forward pass as eq. 3's linear model has it, not clipped
        at zero.  A closed-loop correction (corrected) that finds the backward ops dearer than
        profiled leaves less of the full step to the forward pass; with a cache, what the
        cuts save is still the profiled forward's, so this may go negative (a fixed cost
        below the forward that cached steps leave out, e.g. the input pipeline and augmenting
        they skip).  Predictions and the DP's budget take it as it is, so that the corrected
        model predicts what its fit measured; only the forward floor reported to the user is
        clipped."""
        return self.t_fp - (float(self.saved[0]) if len(self.saved) else 0.0)

    def _depth(self, mask):
        sel = np.flatnonzero(np.asarray(mask, bool)[self.order])
        return int(sel[-1]) if sel.size else None

    def cut_of(self, mask):
        """Index (in the cache's cuts) of the cut a selection's steps start from (the
        output-most one below all its tensors, as prefix/cache.py's PrefixCache.cut_of), None when
        its steps run the whole forward pass.  The cost above prices the cut below every
        tensor down to the deepest selected one: the same cut when tensors are ranked block by
        block (chains, ResNet blocks), else a lower one, an upper bound."""
        mask = np.asarray(mask, bool)
        if not self.cache or not mask.any():
            return None
        cut = int(np.min(np.asarray(self.cache["tensor_cut"], int)[mask]))
        return None if cut < 0 else cut

    def cut_name(self, mask):
        """The name of cut_of(mask), None without one."""
        cut = self.cut_of(mask)
        return None if cut is None else self.cache["cuts"][cut]["name"]

    def fill_passes(self, mask):
        """Passes over the data that fill the store of a selection's cut: one per augmented
        view the cache keeps there (1 for a deterministic prefix), 0 without a cut."""
        cut = self.cut_of(mask)
        return 0 if cut is None else int(self.cache["cuts"][cut].get("views", 1))

    def forward_saved(self, mask):
        """Forward time (ms) a selection's cached steps leave out (as eq. 3's cost prices
        them), 0 without a cut."""
        d = self._depth(mask)
        return 0.0 if d is None else float(self.saved[d])

    def corrected(self, dw_scale, dy_scale):
        """This model with t_dw and t_dy scaled again (by what a run measured), the full step
        still predicting t_full: what the scaled backward ops no longer explain becomes a fixed
        per-step cost, added to the forward pass (an intercept; it may be negative when the
        backward pass proved dearer than profiled)."""
        out = copy.copy(self)
        out.t_dw = self.t_dw * dw_scale
        out.t_dy = self.t_dy * dy_scale
        backward = float(np.sum(out.t_dw) + np.sum(out.t_dy))
        out.t_fp = self.t_full - backward
        out.fixed_ms = out.t_fp - (self.t_fp - self.fixed_ms)
        return out

    @property
    def rho_floor(self):
        """The forward pass's share of a step: no selection is faster than this (with a cache,
        the forward pass of the smallest suffix)."""
        return self.cached_forward_ms / self.t_full

    def backward_budget_ms(self, rho):
        return rho * self.t_full - self._intercept_ms

    def cost_ms(self, mask):
        """Cost of a selection beyond rho_floor's forward pass (mask in trainable order): eq. 3's
        backward cost, plus the forward pass below the cheapest cut that its cut adds."""
        o = self.order
        return selector.eq3_cost(self.t_dw[o], self.t_dy[o], np.asarray(mask, bool)[o],
                                 self.t_fw)

    def predicted_ratio(self, mask):
        return max(self._intercept_ms + self.cost_ms(mask), STEP_FLOOR * self.t_full) / self.t_full

    def select(self, importance, rho, resolution=10000, tolerance=0.0):
        """Exact DP selection (selector.select_tensors) within rho; mask in trainable order.
        tolerance > 0: the cheapest selection whose importance is at least (1 - tolerance) of
        that best one (select_share, exact as well), when its predicted step is at least
        `tolerance` shorter than the best one's: a tie-break toward cheaper selections that
        gives up at most that share of the estimated loss drop, and only for as large a share
        of the step (dropping a few BatchNorm tensors for a fraction of a ms is no trade)."""
        o = self.order
        res = selector.select_tensors(self.t_dw[o], self.t_dy[o], np.asarray(importance)[o],
                                      self.backward_budget_ms(rho), resolution=resolution,
                                      t_fw_ms=self.t_fw)
        mask = self._unorder(res.mask)
        positive = np.clip(np.asarray(importance, float), 0, None)
        kept = float(positive[mask].sum())
        if tolerance <= 0 or kept <= 0:  # an empty selection keeps nothing either
            return mask
        share = (1 - tolerance) * kept / float(positive.sum())
        cheaper = self.select_share(importance, min(share, 1.0), resolution=resolution)
        if cheaper is not None and self.predicted_ratio(cheaper) <= (
                (1 - tolerance) * self.predicted_ratio(mask)):
            return cheaper
        return mask

    def select_share(self, importance, share, resolution=10000, not_deepest=None):
        """The cheapest selection keeping `share` of the positive importance (--rho auto;
        method/cheapest.py, exact like select); mask in trainable order.  not_deepest: a
        tensor (trainable index) that may not be the deepest selected (a runner-up); None
        when no other selection keeps the share."""
        o = self.order
        res = cheapest.select_cheapest(self.t_dw[o], self.t_dy[o], np.asarray(importance)[o],
                                       share, resolution=resolution, t_fw_ms=self.t_fw,
                                       not_deepest=self._position(not_deepest))
        return None if res is None else self._unorder(res.mask)

    def select_rate(self, importance, not_deepest=None):
        """The selection of the most importance per ms of predicted step time (--rho auto's
        rate objective; method/rate.py, exact); mask in trainable order, empty when no tensor
        has positive importance.  The step time is the one predicted_ratio prices (the
        intercept, eq. 3's cost with the cached forward pass), never below STEP_FLOOR of a
        full step.  not_deepest: as select_share's; None when no other selection exists."""
        return self._solve_priced(rate.best_rate, importance, not_deepest)

    def select_gain(self, importance, not_deepest=None):
        """The selection whose importance most exceeds full training's rate times its predicted
        step time (--rho auto's gain objective; method/rate.py's best_gain, exact), priced as
        select_rate prices; mask in trainable order, empty when no tensor has positive
        importance.  not_deepest: as select_share's; None when no other selection exists."""
        return self._solve_priced(rate.best_gain, importance, not_deepest)

    def _solve_priced(self, solver, importance, not_deepest):
        """A rate.py solver on this model: its step priced as predicted_ratio prices it."""
        o = self.order
        res = solver(self.t_dw[o], self.t_dy[o], np.asarray(importance)[o],
                     max(self._intercept_ms, STEP_FLOOR * self.t_full),
                     t_fw_ms=self.t_fw, not_deepest=self._position(not_deepest))
        if res is None:
            return None if not_deepest is not None else np.zeros(len(o), bool)
        return self._unorder(res.mask)

    def deepest(self, mask):
        """The deepest selected tensor of a mask (trainable index), None for an empty one."""
        d = self._depth(mask)
        return None if d is None else int(self.order[d])

    def _position(self, k):
        return None if k is None else int(np.flatnonzero(self.order == k)[0])

    def _unorder(self, mask_output_first):
        mask = np.zeros(len(self.order), bool)
        mask[self.order] = np.asarray(mask_output_first, bool)
        return mask

    def limited_by(self, mask, importance, rho, resolution=10000):
        """Why a selection stops where it does.

        "forward floor": rho is below what no selection can beat.
        "importance": every tensor left out scores <= 0; more budget would buy nothing.
        "depth": tensors worth training were left out and the selection leaves more than
            TOLERANCE of rho unspent, yet even rho * (1 + TOLERANCE) would buy nothing more:
            what is worth training costs more than is left, mostly because it lies so deep
            that eq. 3's error-gradient chain down to it is dear (in a model of a few tensors,
            also because one tensor's t_dw is).  The step is faster than rho on purpose, as
            with "importance".
        "budget": otherwise; a little more budget would buy more importance.
        """
        if rho <= self.rho_floor:
            return "forward floor"
        mask = np.asarray(mask, bool)
        importance = np.asarray(importance, float)
        if not (importance[~mask] > 0).any():
            return "budget" if mask.all() else "importance"
        if self.predicted_ratio(mask) >= rho * (1 - TOLERANCE):
            return "budget"
        gain = np.clip(importance, 0, None)
        more = self.select(importance, rho * (1 + TOLERANCE), resolution=resolution)
        return "budget" if gain[more].sum() > gain[mask].sum() * (1 + 1e-9) else "depth"

    def selection(self, mask):
        """Indices to train for a mask (trainable order), and whether it was empty.  Nothing
        worth its cost (all importances <= 0) trains the output-most tensor rather than
        stalling: its cost is the smallest of all."""
        mask = np.asarray(mask, bool)
        if not mask.any():
            return (int(self.order[0]),), True
        return tuple(int(k) for k in np.nonzero(mask)[0]), False
