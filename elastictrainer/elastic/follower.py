"""A multi-worker run's elastic decisions: the chief runs the runtime (driver.ElasticDriver) and
sends each step's kind and selection to the other workers (Decisions); each of those follows
(ElasticFollower) instead of deciding, so every worker runs the same step and all-reduces the
same tensors' gradients."""
from elastictrainer.errors import RunError

KINDS = ("probe", "full", "selection")  # a step's kind, as the runtime names it


class Decisions:
    """Each step's kind and selection, from the multi-worker run's chief to every worker: an
    all-reduce of [step + 1, kind + 1, selection mask] to which only the chief contributes.
    A worker whose step is not the chief's stops the run (their collectives would pair up
    gradients of different steps, or of different tensors of equal size)."""

    def __init__(self, dist, num_tensors):
        import tensorflow as tf

        self.dist, self.n = dist, int(num_tensors)
        strategy = dist.strategy

        @tf.function
        def exchange(vector):
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(tf.identity, args=(vector,)), axis=None)

        self._exchange = exchange

    def _all_reduce(self, vector):
        import tensorflow as tf

        return self._exchange(tf.constant(vector, tf.float64)).numpy()

    def send(self, step, kind, selection):
        """The chief's side, before its step."""
        import numpy as np

        vector = np.zeros(self.n + 2)
        vector[0], vector[1] = step + 1, KINDS.index(kind) + 1
        if selection:
            vector[2 + np.asarray(selection, int)] = 1
        self._all_reduce(vector)

    def receive(self, step):
        """Another worker's side, before its step: (kind, selection) of the chief's."""
        import numpy as np

        got = self._all_reduce(np.zeros(self.n + 2))
        chief_step = int(round(got[0])) - 1
        if chief_step != step:
            raise RunError(f"{self.dist.worker} is at step {step} but the chief at "
                           f"{chief_step}: the workers resumed from different checkpoints; "
                           f"start every worker again from the same one")
        return KINDS[int(round(got[1])) - 1], tuple(int(k) for k in np.nonzero(got[2:] > 0.5)[0])


class ElasticFollower:
    """What a multi-worker run's other workers use instead of the elastic driver
    (driver.ElasticDriver): every step runs what the chief decided for it."""

    def __init__(self, trainer, dist):
        self.trainer = trainer
        self.decisions = Decisions(dist, len(trainer.variables))
        self.selection = None
        self.ran = (None, None)
        self.rt = None  # the runtime is the chief's

    def on_train_begin(self):
        return None

    def train_step(self, global_step, x, y):
        kind, selection = self.decisions.receive(global_step)
        self.ran = (kind, None if kind != "selection" else selection)
        if kind in ("probe", "full"):  # the chief takes the importance; here the gradients
            return self.trainer.probe_step(x, y, want_terms=False)[:2]
        self.selection = selection
        return self.trainer.step_for(selection)(x, y)

    def on_epoch_end(self, epoch, global_step):
        pass

    def on_train_end(self, train_time_s, global_step):
        return None
