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
    # images of another size than the model's input, and one-hot labels: one line each, before
    # a step's trace would say it in a traceback, and no run directory left behind
    small = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 8, 8, 3)), tf.zeros(8, tf.int32)))
    with pytest.raises(UserError, match=r"^the train set's images are \(8, 8, 3\), but .* takes "
                                        r"\(16, 16, 3\): resize them"):
        elastictrainer.run(cfg, model=tiny_model(), data=(small.batch(4), small.batch(4)))
    hot = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 16, 16, 3)), tf.zeros((8, 10))))
    with pytest.raises(UserError, match=r"labels are \(4, 10\) a batch; they must be class "
                                        r"indices"):
        elastictrainer.run(cfg, model=tiny_model(), data=(hot.batch(4), hot.batch(4)))
    assert not list(tmp_path.iterdir())
