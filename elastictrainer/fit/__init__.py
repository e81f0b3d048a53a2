"""ElasticTrainer inside Keras' `model.fit`: ElasticCallback (callback.py), the timing table it
finds or profiles (timing_table.py), what it saves for a restart (persist.py) and the steps it
gives fit (steps.py), driving the same runtime (elastic/) and recorder (run/recorder.py) as the
command line."""
