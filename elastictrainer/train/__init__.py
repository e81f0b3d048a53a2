"""The compiled steps that train: one device's (steps.py), tf.distribute's
(distributed_steps.py) and its devices and batches (distribution.py), and one compiled step per
tensor selection, cached (compiled.py).  It trains what it is told; what to train is decided
above it (elastic/, run/, fit/)."""
