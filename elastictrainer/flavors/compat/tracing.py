"""Private TensorFlow API around traced code: the graphs a tf.function has traced and the
functions a traced graph calls, AutoGraph's conversion rules, and the protobuf of the profiler's
trace.

tf.function
    concrete_functions (`_list_all_concrete_functions`): the graphs a tf.function has traced
        so far, for their size (train/compiled.graph_bytes) and whether a call would trace
        (train/steps.ProbeStep.traced).  `experimental_get_tracing_count` counts traces but gives no
        graph, and `get_concrete_function` needs a signature and traces when it has none.
    library_function_graphs (`Graph._functions`): the traced FuncGraphs of the functions a
        graph calls (train/collectives.py reads the shapes of the tensors that enter its
        all-reduce ops).  The public GraphDef gives their FunctionDefs, which carry no tensor
        shapes.

AutoGraph (tf_setup.py)
    autograph_do_not_convert (`tensorflow.python.autograph.core.config`, a rule's `_prefix`):
        tells AutoGraph to leave a module's code unconverted.  TensorFlow 2.21's rules already
        skip tf_keras; 2.16's name only `keras`, so it transpiles all of tf_keras for every
        traced step (tf_setup.py has the timings).  `tf.autograph.experimental.do_not_convert`
        marks single functions only, and `autograph=False` would stop converting users' own
        layers too.

Profiler (profiler/trace.py)
    xplane_pb2 (`tensorflow.tsl.profiler.protobuf.xplane_pb2`): the protobuf of the
        .xplane.pb that tf.profiler writes.  TensorFlow exports no reader; the profile
        plugin's op tables stop at 500 rows.
"""

# -- tf.function ------------------------------------------------------------------------------

def concrete_functions(function):
    """The concrete functions a tf.function has traced so far (empty before its first call)."""
    return function._list_all_concrete_functions()


def library_function_graphs(graph):
    """{name: FuncGraph} of the functions a traced graph holds in its library (what its If,
    While and PartitionedCall ops call, nested calls included).  The public GraphDef gives their
    FunctionDefs, which carry no tensor shapes; the traced FuncGraphs do (train/collectives.py
    reads the shapes that enter all-reduce ops)."""
    found = {}
    for name, function in getattr(graph, "_functions", {}).items():
        nested = getattr(function, "graph", None)
        if nested is not None:
            found[name] = nested
    return found


# -- AutoGraph --------------------------------------------------------------------------------

def autograph_do_not_convert(module_prefix):
    """Make AutoGraph leave the code of `module_prefix` (a top-level module name) unconverted,
    unless a rule for it is there already."""
    from tensorflow.python.autograph.core import config as ag_config

    if not any(getattr(r, "_prefix", None) == module_prefix for r in ag_config.CONVERSION_RULES):
        ag_config.CONVERSION_RULES += (ag_config.DoNotConvert(module_prefix),)


# -- profiler ---------------------------------------------------------------------------------

def xplane_pb2():
    """TensorFlow's bundled xplane protobuf module (XSpace, the .xplane.pb format)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2 as module

    return module
