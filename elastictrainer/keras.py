"""`from elastictrainer.keras import ElasticCallback`: the documented short name of
elastictrainer.fit.callback.ElasticCallback (ElasticTrainer in model.fit), and of
`efficientnet_lite0(keras)`, an ImageNet backbone built in the user's Keras (models/efficientnet.py)."""
from elastictrainer.fit.callback import ElasticCallback  # noqa: F401
from elastictrainer.models.efficientnet import efficientnet_lite0  # noqa: F401
