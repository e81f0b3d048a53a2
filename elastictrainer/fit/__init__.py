"""ElasticTrainer inside Keras' `model.fit`: ElasticCallback (callback.py) and the steps it
gives fit (steps.py), driving the same runtime (elastic/) and recorder (run/recorder.py) as the
command line."""
