"""Tensor importance (paper Sec. 4.1, eq. 4-6) and the ablations of Fig. 22.

Each estimator takes the trainer (trainer.Trainer: `variables`, `optimizer`, `step_for`,
`grads_fn`) and a list of probe batches, and returns one float per trainable tensor
(model.trainable_weights order); higher means training the tensor lowers the loss more.
The elastic schemes (schemes.py) name their estimator in IMPORTANCE.  NumPy only.
"""
import numpy as np

from elastictrainer.common import Registry

IMPORTANCE = Registry("importance")


def _probe_importance(tr, x, y):
    """-g(w + dw) . dw per tensor after one optimizer step dw on all weights; weights and
    optimizer state (slots, iteration count) are restored bit for bit afterwards.

    Memory: only the snapshot needed to restore is kept whole; dw and each gradient are formed
    one tensor at a time (holding dw and the gradients as full copies on top of the snapshot
    raised an elastic run's peak above full training's)."""
    weights0 = [v.numpy() for v in tr.variables]
    opt0 = [v.numpy() for v in tr.optimizer.variables]
    try:
        tr.step_for(tuple(range(len(tr.variables))))(x, y)
        grads = list(tr.grads_fn(x, y))
        out = np.empty(len(grads))
        for k, (v, w) in enumerate(zip(tr.variables, weights0)):
            d = v.numpy() - w
            out[k] = -float(np.sum(grads[k].numpy().astype(np.float64) * d))
            grads[k] = d = None  # free as we go
    finally:
        for v, w in zip(tr.variables, weights0):
            v.assign(w)
        for v, w in zip(tr.optimizer.variables, opt0):
            v.assign(w)
    return out


@IMPORTANCE.register("taylor")
def taylor_importance(tr, batches):
    """Paper eq. 4-6: I_k = -sum_i g_i(w + dw) * dw_i, the first-order estimate of the loss drop
    that tensor k's update brings (dw: one optimizer step on the probe batch)."""
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        total += _probe_importance(tr, x, y)
    return total


@IMPORTANCE.register("weight_magnitude")
def weight_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |w_k|."""
    return np.array([float(np.sum(np.abs(v.numpy()))) for v in tr.variables])


@IMPORTANCE.register("grad_magnitude")
def grad_magnitude_importance(tr, batches):
    """Ablation: I_k = sum |g_k| on the probe batches."""
    total = np.zeros(len(tr.variables))
    for x, y in batches:
        total += [float(np.sum(np.abs(g.numpy()))) for g in tr.grads_fn(x, y)]
    return total


def normalize(importance):
    """Scale by max |I| (as the reference), so importances are comparable across evaluations."""
    m = float(np.max(np.abs(importance))) if len(importance) else 0.0
    return importance / m if m > 0 else importance
