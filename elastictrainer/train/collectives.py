"""What a traced step really all-reduces, read from its graph: every all-reduce op of its
concrete functions, in the functions they call too (nested tf.functions, If and While
branches), with the shape and dtype of the tensor each replica puts in.  Read from the graph, a
reduce is counted once per call of its function: one in an If branch counts as though its
branch ran, one in a While body as though the body ran once (the steps here have neither).

This is measured independently of the steps' own count (DistributedStep.allreduce_bytes, which
summary.json's allreduce_bytes_per_step sums): the tests compare the two, so a step that
all-reduced a frozen tensor's gradient would show here even where its count said otherwise.
"""
import collections

# The ops that all-reduce a tensor across replicas: tf.distribute's collective ops on CPUs and
# across workers, NCCL's on GPUs.  Input 0 is the tensor each replica contributes.
ALLREDUCE_OPS = frozenset({"CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                           "NcclAllReduce"})

AllReduce = collections.namedtuple("AllReduce", "device op dtype shape nbytes")


def _functions(step):
    """The tf.functions behind a step: a step object's tf_functions(), the tf.function itself,
    or else the tf.functions among the object's attributes."""
    import tensorflow as tf

    if hasattr(step, "tf_functions"):
        return step.tf_functions()
    if isinstance(step, tf.types.experimental.GenericFunction):
        return [step]
    return [v for v in vars(step).values()
            if isinstance(v, tf.types.experimental.GenericFunction)]


def _called(op):
    """Names of the functions an op calls (its function-valued attributes)."""
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


def _walk(graph, library, device):
    from elastictrainer.flavors import compat

    library = {**library, **compat.library_function_graphs(graph)}
    for op in graph.get_operations():
        where = op.device or device  # ops in a called function run where the call does
        if op.type in ALLREDUCE_OPS:
            tensor = op.inputs[0]
            if not tensor.shape.is_fully_defined():
                raise ValueError(f"{op.name} all-reduces a tensor of unknown shape "
                                 f"{tensor.shape}: its bytes are not known from the graph")
            yield AllReduce(where, op.type, tensor.dtype.name, tuple(tensor.shape.as_list()),
                            tensor.shape.num_elements() * tensor.dtype.size)
        for name in _called(op):  # every call counts: a function called twice reduces twice
            if name in library:
                yield from _walk(library[name], library, where)


def allreduces(step):
    """Every all-reduce of one call of `step` (a tf.function, a step object with
    tf_functions(), or an object holding tf.functions: one call of each), as AllReduce(device, op, dtype, shape, nbytes), one per replica that runs
    it.  A step traced more than once (another input signature) gives its first trace's;
    None before the step's first call."""
    from elastictrainer.flavors import compat

    found, traced = [], False
    for function in _functions(step):
        concrete = compat.concrete_functions(function)
        if concrete:
            traced = True
            found += list(_walk(concrete[0].graph, {}, ""))
    return found if traced else None


def allreduce_bytes(step):
    """Bytes each replica puts into all-reduces in one call of `step` (allreduces()), None
    before its first call.  Every replica of a synchronous step all-reduces the same tensors; a
    graph whose devices disagree raises ValueError."""
    found = allreduces(step)
    if found is None:
        return None
    per_device = collections.Counter()
    for a in found:
        per_device[a.device] += a.nbytes
    amounts = set(per_device.values())
    if len(amounts) > 1:
        raise ValueError(f"the replicas all-reduce different amounts: {dict(per_device)}")
    return amounts.pop() if amounts else 0
