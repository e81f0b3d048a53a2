"""`from elastictrainer.keras import ElasticCallback`: the documented short name of
elastictrainer.fit.callback.ElasticCallback (ElasticTrainer in model.fit)."""
from elastictrainer.fit.callback import ElasticCallback  # noqa: F401
