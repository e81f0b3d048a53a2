"""collectives.py reads what a traced step all-reduces from its graph: the tensors entering
all-reduce ops, in nested functions and branches too, one call counted each time it is made.
The graphs are traced, never run (a collective would wait for its other replicas)."""
import pytest
import tensorflow as tf

from elastictrainer.train import collectives


def _reduce(v, key):
    return tf.raw_ops.CollectiveReduceV2(input=v, group_size=2, group_key=1, instance_key=key,
                                         ordering_token=[], merge_op="Add", final_op="Id")


def _traced(function, *specs):
    function.get_concrete_function(*specs)
    return function


def test_the_bytes_are_the_reduced_tensors_in_nested_functions_and_branches():
    @tf.function
    def inner(v):
        return _reduce(v * 2.0, 1)

    @tf.function
    def step(x, n):
        y = tf.cond(tf.reduce_sum(x) > 0, lambda: inner(x), lambda: x)  # a branch: 5 floats
        z = inner(tf.reshape(y, [-1]))  # called again: another 5
        counts = _reduce(tf.cast(n, tf.float64), 2)  # 3 doubles
        return z, counts

    traced = _traced(step, tf.TensorSpec([5], tf.float32), tf.TensorSpec([3], tf.int32))
    found = collectives.allreduces(traced)
    assert sorted((a.op, a.dtype, a.shape) for a in found) == [
        ("CollectiveReduceV2", "float32", (5,)), ("CollectiveReduceV2", "float32", (5,)),
        ("CollectiveReduceV2", "float64", (3,))]
    assert collectives.allreduce_bytes(traced) == 2 * 5 * 4 + 3 * 8


def test_nothing_traced_is_none_and_a_step_without_collectives_is_zero():
    @tf.function
    def plain(x):
        return x + 1.0

    assert collectives.allreduce_bytes(plain) is None
    assert collectives.allreduce_bytes(_traced(plain, tf.TensorSpec([4]))) == 0


def test_replicas_that_reduce_different_amounts_and_unknown_shapes_are_refused():
    @tf.function
    def lopsided(x):
        with tf.device("/cpu:0"):
            a = _reduce(x, 1)
        with tf.device("/cpu:1"):
            b = _reduce(x[:2], 1)
        return a, b

    with pytest.raises(ValueError, match="different amounts"):
        collectives.allreduce_bytes(_traced(lopsided, tf.TensorSpec([4])))

    @tf.function
    def ragged(x):
        return _reduce(x, 1)

    with pytest.raises(ValueError, match="unknown shape"):
        collectives.allreduce_bytes(_traced(ragged, tf.TensorSpec([None])))


def test_an_object_holding_tf_functions_is_read_through_them():
    class Holder:
        def __init__(self):
            self.reduce = tf.function(lambda v: _reduce(v, 1))
            self.plain = tf.function(lambda v: v + 1.0)

    holder = Holder()
    assert collectives.allreduce_bytes(holder) is None  # nothing traced yet
    holder.reduce.get_concrete_function(tf.TensorSpec([6], tf.float64))
    assert collectives.allreduce_bytes(holder) == 6 * 8
