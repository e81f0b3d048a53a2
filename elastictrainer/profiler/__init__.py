"""The Tensor Timing Profiler (paper Sec. 5): per-tensor backward times from a real trace.

    dataflow.py     which trainable tensors need each op of the traced training step
    trace.py        op times read from the .xplane.pb that tf.profiler writes
    attribution.py  op times -> per-tensor t_dw / t_dy (and FLOPs estimates for missed tensors)
    calibration.py  timed reference selections -> separate t_dw / t_dy scales
    table_format.py the timing table's format: records, validation, older versions migrated
    table.py        the timing table's files: where it lives, writing it, reading it back
    run.py          the driver: profile a model and write its table, or find one to reuse
    assemble.py     a profiling's measurements (timed steps, attribution, references) -> its table
    child.py        profiling in a child process that builds the model again (its parent side)
    reuse.py        tables kept in this process for the next run of the same model and shapes
    phases.py       where profiling's seconds go, and the line a run logs about it

Importing this package imports none of them.
"""
