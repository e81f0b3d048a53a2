"""The pace check (elastic/pace.py) on a tiny model: its two arms against the naive reference
(the trainer's own steps of every tensor and of the selection, run on the held batches from the
same weights), everything it moves put back, and batches of another size not held."""
import numpy as np
import pytest
import tf_keras as keras

from elastictrainer.elastic.pace import PaceCheck
from elastictrainer.fit.steps import FitSteps
from elastictrainer.flavors import batchnorm, optimizers
from elastictrainer.method import schemes
from elastictrainer.method.roles import tensor_roles
from elastictrainer.train import compiled

from helpers import batch, snapshot, tiny_model  # noqa: E402


def _trainer(hold=False, driver="cli"):
    """The command line's trainer, or model.fit's (the model compiled with its metrics)."""
    keras.utils.set_random_seed(3)
    model = tiny_model()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3)
    bn_hold = (batchnorm.FrozenHold(model, list(model.trainable_weights)) if hold else None)
    if driver == "fit":
        model.compile(optimizer=optimizer, metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        optimizers.prepare_optimizer(optimizer, model.trainable_weights)
        return FitSteps(model, optimizer, schemes.SCHEMES["elastic_training"].importance,
                        bn_hold=bn_hold)
    optimizers.prepare_optimizer(optimizer, model.trainable_weights)
    return compiled.CompiledSteps(model, optimizer, schemes.SCHEMES["elastic_training"],
                                  tensor_roles(model), bn_hold=bn_hold)


def _everything(tr):
    return (list(tr.model.weights)
            + list(tr.optimizer.variables)
            + [v for metric in tr.model.metrics for v in metric.variables])


def _naive(tr, selection, held):
    """Each held batch's loss drop after the trainer's own step of `selection` on each held
    batch in turn, from the weights as they are; everything put back."""
    kept = _everything(tr)
    values = snapshot(kept)

    def losses():
        out = [float(tr.loss_of(data)) for data in held]
        return np.array(out)

    before = losses()
    for v, k in zip(kept, values):
        v.assign(k)
    step = tr.step_for(tuple(selection))
    for data in held:
        step(*data)
    after = losses()
    for v, k in zip(kept, values):
        v.assign(k)
    return before - after


@pytest.mark.parametrize("driver", ["cli", "fit"])
def test_the_pace_checks_arms_are_the_trainers_steps_and_everything_is_put_back(driver):
    """From weights with momentum built up by real steps, compare()'s drops of every tensor
    and of the head alone are those of the trainer's own steps (var_list steps, the naive
    reference); the weights, the optimizer's slots and iteration count, BatchNorm's moving
    statistics and model.fit's metrics are bit for bit as before; the held batches are
    released.  The command line's trainer and model.fit's alike."""
    tr = _trainer(driver=driver)
    n = len(tr.variables)
    everything, head = tuple(range(n)), (n - 2, n - 1)
    for seed in range(3):  # momentum and moving statistics away from their start
        tr.step_for(everything)(*batch(seed=seed))
    pace = PaceCheck(tr)
    held = [batch(seed=10 + k) for k in range(5)]
    for data in held:
        pace.hold(data)
    kept = _everything(tr)
    before = snapshot(kept)
    full, mine = pace.compare(head)
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(kept, before))
    np.testing.assert_allclose(full, _naive(tr, everything, held), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mine, _naive(tr, head, held), rtol=1e-4, atol=1e-6)
    assert not np.allclose(full, mine)  # the arms differ in which tensors moved
    assert pace.compare(head) is None  # released: nothing held


def test_a_batch_of_another_size_is_not_held():
    """The epoch's last, partial batch would trace the check's step again: it is not held,
    and fewer than four held batches are not compared."""
    tr = _trainer()
    pace = PaceCheck(tr)
    for k in range(3):
        pace.hold(batch(seed=k))
    pace.hold(batch(n=2, seed=5))
    assert pace.compare((0,)) is None
    for k in range(3):
        pace.hold(batch(seed=k))
    pace.hold(batch(n=2, seed=5))
    pace.hold(batch(seed=7))
    full, mine = pace.compare((0,))
    assert len(full) == len(mine) == 4


def test_under_bn_mode_frozen_both_arms_run_batchnorm_as_a_full_step():
    """With a BatchNorm hold, the check releases it for both arms (the first convolution's
    layer below a head-only selection would otherwise run on moving statistics in one arm):
    the head's arm equals the naive reference taken with nothing held."""
    tr = _trainer(hold=True)
    n = len(tr.variables)
    head = (n - 2, n - 1)
    pace = PaceCheck(tr)
    held = [batch(seed=20 + k) for k in range(4)]
    for data in held:
        pace.hold(data)
    tr.bn_hold.hold(head)  # as the run left it
    _, mine = pace.compare(head)
    assert tr.bn_hold.held == ()
    reference = _trainer()
    for a, b in zip(reference.model.weights, tr.model.weights):
        a.assign(b)
    np.testing.assert_allclose(mine, _naive(reference, head, held), rtol=1e-4, atol=1e-6)


def test_the_check_stays_off_where_it_cannot_run_and_says_why():
    """Off unless asked; under tf.distribute and with the prefix cache on, off with one line
    each; on one device without the cache, a PaceCheck."""
    from types import SimpleNamespace

    from elastictrainer.elastic.pace import for_trainer

    said = []
    tr = _trainer()
    assert for_trainer(tr, False, said.append) is None and said == []
    assert isinstance(for_trainer(tr, True, said.append), PaceCheck) and said == []
    spread = SimpleNamespace(dist=object(), prefix_cache=None)
    cached = SimpleNamespace(dist=None, prefix_cache=object())
    assert for_trainer(spread, True, said.append) is None
    assert for_trainer(cached, True, said.append) is None
    assert said == ["elastic: the pace check is off: it runs on one device, not under "
                    "tf.distribute",
                    "elastic: the pace check is off: the prefix cache's steps train on stored "
                    "activations, not the batches it holds"]
