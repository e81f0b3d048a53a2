"""The Python API: what elastictrainer.run refuses in one line before training anything."""


def test_api_refuses_what_it_cannot_train(tmp_path):
    import pytest
    import tensorflow as tf

    import elastictrainer
    from helpers import tiny_model
    from elastictrainer.errors import UserError
    cfg = elastictrainer.Config(logdir=str(tmp_path), num_epochs=1)
    ds = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 16, 16, 3)), tf.zeros(8, tf.int32)))
    with pytest.raises(UserError, match="tf.data.Dataset"):
        elastictrainer.run(cfg, model=tiny_model(), data=(ds.batch(4), [1, 2]))
    with pytest.raises(UserError, match="needs model"):
        elastictrainer.run(cfg, data=(ds.batch(4), ds.batch(4)))
    with pytest.raises(UserError, match="length is unknown"):
        elastictrainer.run(cfg, model=tiny_model(), data=(ds.batch(4).repeat(), ds.batch(4)))
