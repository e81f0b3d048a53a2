"""How the runtime judges the current selection when a re-selection falls due: whether its
training loss fell over its interval (trend.py), and with --pace_check whether it keeps full
training's pace per second of step (pace.py).  A selection judged failing is re-probed whatever
the overhead budget says (economy.py), and under rho auto the run widens towards full training
(budget.py): eq. 4-6 estimate the loss drop a selection brings, and these judge what it brought.

Only a partial selection past the head warm-up is judged: every tensor has nothing to gain from
another, and the head trains alone on purpose.  The judge reads and writes the runtime's state
(ElasticState: the interval's bucketed losses, the first judged loss, the pace check's words
for the re-selection under way, so that a checkpoint between the check and the solve keeps
them).  Plain Python: the check itself runs through the `pace` callable it is given."""
from elastictrainer.elastic import accounting, trend
from elastictrainer.elastic.state import HEAD_WARMUP


class Judge:
    """pace(selection): the pace check's loss drops (pace.PaceCheck.compare), None without
    --pace_check; auto: rho auto (only it widens, so only it asks the pace check); clock:
    seconds; log(message)."""

    def __init__(self, pace=None, auto=False, *, clock, log):
        self._pace = pace if auto else None
        self.clock = clock
        self.log = log

    @staticmethod
    def partial(s):
        """Whether the current selection is judged by its loss: a partial one, past the head
        warm-up."""
        return not (s.mask is None or all(s.mask) or s.records[-1]["reason"] == HEAD_WARMUP)

    def trend(self, s):
        """(stalled words or None, trend words or None, failing) of the current selection's
        loss over its interval; failing: stalled with the loss still high (trend.failing)."""
        if not self.partial(s):
            return None, None, False
        judged = trend.judge(s.losses)
        stalled, words = trend.verdict(judged)
        if s.start_loss is None and judged is not None:
            s.start_loss = judged[0]
        return ((words if stalled else None), words,
                stalled and trend.failing(judged, s.start_loss))

    def before_probes(self, s, global_step):
        """Words on why the current selection must be re-probed past the budget (its loss did
        not fall, or it is behind full training's pace), else None.  The pace check runs here,
        on the batches the selection trained last, before the probes' steps replace them; its
        words wait in the state for the solve (verdict)."""
        stalled, _, failing = self.trend(s)
        s.paced = None if failing or self._pace is None else self._behind(s, global_step)
        return stalled or s.paced

    def verdict(self, s):
        """The trend's (stalled, words, failing) for the solve, a selection the pace check
        found behind counted as failing; the check's words are used up."""
        stalled, words, failing = self.trend(s)
        if s.paced and not failing:
            stalled, words, failing = s.paced, s.paced, True
        s.paced = None
        return stalled, words, failing

    def _behind(self, s, global_step):
        """Words when the current selection trains more slowly per second than full training
        would from here (pace.py), while its loss is still high (trend.failing), else None."""
        if not self.partial(s) or not trend.failing(trend.judge(s.losses), s.start_loss):
            return None
        # its step ratio as measured by the closed loop, else as predicted
        ratio = (dict((tuple(k), v) for k, v in s.measured).get(tuple(s.selection))
                 or s.records[-1]["predicted_ratio"])
        words, spent, s.records[-1]["pace"] = trend.paced(
            self._pace, s.selection, ratio, self.clock, self.log, global_step)
        accounting.book_overhead(s, "importance", spent)
        return words
