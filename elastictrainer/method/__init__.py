"""The paper's method, as data and functions: what a step costs (time_model.py, eq. 3, with
its exact solver in selector.py), how much each tensor matters (importance.py, eq. 4-6), which
tensors each --train_type trains (schemes.py) and each tensor's role (roles.py).  It decides
nothing over time: the runtime (elastic/) calls it.  Importing it imports no TensorFlow."""
