"""A functional model, tf-keras or Keras 3, as one flat graph of layer calls, its cut points,
and the sub-models on either side of a cut (the frozen prefix and the trained suffix; cache.py).

Nested functional models (the built-in models' backbones, a Keras 3 backbone called inside an
outer model) are flattened: each of their layer calls becomes a call of the flat graph, with
the training mode the nesting gives it in the model's Keras (the flavor's call_mode): in
tf-keras a backbone called with training=False runs its BatchNorm layers in inference mode,
whatever the step's mode; Keras 3 hands a model's mode to every call of its graph, so there the
step's training=True wins over the backbone's training=False.  Every BatchNorm layer under
--bn_mode inference runs in inference mode either way.  A subclassed model or layer stays one
opaque call.  The model's calls, with their arguments and tensors, come from its flavor module
(graph_calls; the private attributes they read are compat's); this module is the same for
both Kerases.  Sub-models call the same layer objects again on new inputs (public functional
API), so they share every weight with the model.

A cut is a tensor every path from the input to the output goes through: the calls after it
(the suffix) need nothing from before it but the cut itself.  For a ResNet these are the block
outputs, for a plain CNN every layer's output.  Cuts are totally ordered (each one dominates
the output), so suffixes are nested; the time model and the cache index them from the input
(0) up.

What draws random numbers is read from the traced graph, not from the layers: the prefix of the
output-most cut, traced as the cached step runs it (training=True, calls the nesting fixes in
their own mode), is searched for random ops, stateful and stateless, function bodies (while,
cond, called functions) included; each op is charged to the layer call whose name scope made
it.  So a Lambda or custom layer that calls tf.random.* or tf.image.random_* counts as
Keras's augmentation, dropout and noise layers do, and a random layer that runs in inference
mode (in a backbone called with training=False) does not.
"""
from elastictrainer.flavors import tf_setup  # noqa: F401  (quiet TensorFlow first)

import dataclasses
import re
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from elastictrainer import flavors
from elastictrainer.flavors import batchnorm

# Relative cost of one output element of any layer (normalisation, activation, resampling,
# adds), against one multiply-add of a kernel counted as two: a memory-bound element costs
# about what a few multiply-adds do on a CPU.  Only for the forward shares of the suffixes,
# which the time model scales to the profiled forward pass; the closed loop measures the steps.
ELEMENT_COST = 8.0
# Op types that draw random numbers (is_random_op), by the words TensorFlow's names for them
# share: RandomUniform, StatelessRandomUniformV2, RandomShuffle, RngReadAndSkip,
# StatefulUniformFullInt, StatelessTruncatedNormalV2, Multinomial, SampleDistortedBoundingBox,
# StatelessShuffle, AnonymousSeedGenerator...; the words also name ops still to come.
_RANDOM_OP = re.compile(r"Random|^Rng|^Stateful(?!PartitionedCall$)|TruncatedNormal|Multinomial"
                        r"|SampleDistortedBoundingBox|Shuffle|SeedGenerator")


@dataclasses.dataclass
class Call:
    """One layer call of the flat graph (`layer`: a Keras 3 graph may also call an operation
    that is no layer, such as `keras.ops.add` or `x * y` on its tensors, which has no
    weights)."""
    layer: Any
    args: Any                 # (call_args, call_kwargs), KerasTensors as in the model
    inputs: List[int]         # value ids it reads
    outputs: List[int]        # value ids it makes
    training: Optional[bool]  # fixed by an enclosing call, None: the step's mode
    tensors: Any = None       # its output KerasTensors


@dataclasses.dataclass
class Cut:
    """A cut point: the value `value`, made by call `position` of the flat graph."""
    name: str
    value: int
    position: int
    shape: tuple              # per example
    dtype: Any
    suffix: frozenset         # positions of the calls after it
    forward_share: float = 0.0  # the suffix's share of the forward pass (estimated)
    augmentation: tuple = ()    # layers with random ops before it and the first weights
    random_prefix: tuple = ()   # other layers with random ops before it (dropout, noise)
    batch_prefix: tuple = ()    # batch-dependent layers in training mode before it

    @property
    def bytes_per_example(self):
        return int(np.prod(self.shape)) * tf.as_dtype(self.dtype).size


class FlatGraph:
    """The model's layer calls in topological order (`calls`), its input and output values,
    its cuts from the input up (`cuts`), and the random op types of each layer call in the
    output-most cut's prefix (`random_ops`, by layer name).  UserError-free: `why_not` says
    why a model has no cut (not a functional model of either Keras, several inputs or
    outputs)."""

    def __init__(self, model):
        self.model = model
        self.calls, self.why_not, self.cuts, self.random_ops = [], None, [], {}
        self._canon, self._kt = {}, {}
        self.flavor = flavors.for_model(model) if flavors.is_model(model) else None
        if self.flavor is None or not self.flavor.is_functional(model):
            self.why_not = ("it is not a functional model (a subclassed model is one opaque "
                            "call)")
            return
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            self.why_not = "it has more than one input or output"
            return
        self.input = self._key(model.inputs[0])
        self._walk(model, None)
        self.output = self._key(model.outputs[0])
        self.cuts = self._find_cuts()

    # ------------------------------------------------------------------ flattening
    def _key(self, kt):
        k = id(kt)
        self._kt.setdefault(k, kt)
        return self._canon.get(k, k)

    def _walk(self, model, training):
        for layer, call_args, call_kwargs, inputs, outputs in self.flavor.graph_calls(model):
            mode = self.flavor.call_mode(call_kwargs, training)
            if self.flavor.is_functional(layer):
                for t, a in zip(layer.inputs, inputs):
                    self._canon[id(t)] = self._key(a)
                self._walk(layer, mode)
                for t, o in zip(outputs, layer.outputs):
                    self._canon[id(t)] = self._key(o)
                continue
            self.calls.append(Call(
                layer=layer, args=(call_args, call_kwargs), training=mode,
                inputs=[self._key(t) for t in inputs],
                outputs=[self._key(t) for t in outputs], tensors=list(outputs)))

    # ------------------------------------------------------------------ cuts
    def _find_cuts(self):
        made_at = {v: i for i, c in enumerate(self.calls) for v in c.outputs}
        readers = {}
        for i, c in enumerate(self.calls):
            for v in c.inputs:
                readers.setdefault(v, []).append(i)
        costs = [call_cost(c) for c in self.calls]
        total = sum(costs) or 1.0
        cuts = []
        for i, c in enumerate(self.calls):
            if len(c.outputs) != 1 or c.outputs[0] == self.output:
                continue
            v = c.outputs[0]
            suffix, todo = set(), list(readers.get(v, []))
            while todo:
                j = todo.pop()
                if j not in suffix:
                    suffix.add(j)
                    todo += [r for o in self.calls[j].outputs for r in readers.get(o, [])]
            closed = all(u == v or made_at.get(u) in suffix
                         for j in suffix for u in self.calls[j].inputs)
            if not suffix or not closed or made_at.get(self.output) not in suffix:
                continue
            prefix = [j for j in range(len(self.calls)) if j not in suffix]
            kt = c.tensors[0]
            cuts.append(Cut(
                name=c.layer.name, value=v, position=i, shape=tuple(kt.shape[1:]),
                dtype=kt.dtype, suffix=frozenset(suffix),
                forward_share=sum(costs[j] for j in suffix) / total,
                batch_prefix=tuple(self.calls[j].layer.name for j in prefix
                                   if self.calls[j].training is not False
                                   and is_batch_dependent(self.calls[j].layer,
                                                          self.flavor))))
        if not cuts:
            return cuts
        random_calls = self._random_calls(cuts[-1])
        weighted = [i for i, c in enumerate(self.calls) if _weights(c.layer)]
        first_weighted = weighted[0] if weighted else len(self.calls)

        def random_in(cut, augmentation):
            return tuple(self.calls[j].layer.name for j in sorted(random_calls)
                         if j not in cut.suffix and (j < first_weighted) == augmentation)

        return [dataclasses.replace(c, augmentation=random_in(c, True),
                                    random_prefix=random_in(c, False)) for c in cuts]

    def _random_calls(self, cut):
        """Positions of the calls in `cut`'s prefix that run random ops, as the cached step
        runs that prefix (module doc); `random_ops` gets their op types.  An op no call's name
        scope claims is charged to every call of the prefix."""
        prefix = self.prefix_model(cut)
        spec = tf.TensorSpec(prefix.inputs[0].shape, prefix.inputs[0].dtype)
        traced = tf.function(lambda x: prefix(x, training=True)).get_concrete_function(spec)
        at = {}
        for j, c in enumerate(self.calls):
            if j not in cut.suffix:
                at.setdefault(c.layer.name, []).append(j)
        found = {}
        for scope, ops in random_ops_by_scope(traced.graph.as_graph_def()).items():
            # a layer called again in one graph opens its scope as "<name>_1"
            calls = at.get(scope) or at.get(re.sub(r"_\d+$", "", scope or ""))
            for j in calls or [j for names in at.values() for j in names]:
                found.setdefault(j, set()).update(ops)
        self.random_ops = {self.calls[j].layer.name: tuple(sorted(ops))
                           for j, ops in sorted(found.items())}
        return set(found)

    def tensor_cuts(self, variables):
        """For each of `variables` (the model's trainable weights), the index in `cuts` of the
        output-most cut whose suffix holds it and whose prefix does not, -1 for none."""
        where = {}
        for i, c in enumerate(self.calls):
            for w in _weights(c.layer, trainable=True):
                where.setdefault(id(w), set()).add(i)
        out = []
        for v in variables:
            calls = where.get(id(v))
            best = -1
            for k, cut in enumerate(self.cuts):
                if calls and calls <= cut.suffix:
                    best = k
            out.append(best)
        return out

    # ------------------------------------------------------------------ sub-models
    def prefix_model(self, cut):
        """input -> cut, the model's layers (shared weights)."""
        keep = set(range(len(self.calls))) - set(cut.suffix)
        return self._rebuild(self.input, self.model.inputs[0], keep, cut.value, "prefix")

    def suffix_model(self, cut):
        """cut -> output, the model's layers (shared weights)."""
        kt = self._kt[cut.value]
        start = self.flavor.graph_input(kt.shape[1:], kt.dtype, f"{cut.name}_cached")
        return self._rebuild(cut.value, start, set(cut.suffix), self.output, "suffix")

    def _rebuild(self, source, start, keep, target, name):
        values = {source: start}
        for i, c in enumerate(self.calls):
            if i not in keep:
                continue
            call_args, call_kwargs = tf.nest.map_structure(
                lambda a: values[self._key(a)] if id(a) in self._kt else a, c.args)
            call_kwargs = dict(call_kwargs)
            if c.training is not None and "training" not in call_kwargs:
                call_kwargs["training"] = c.training
            out = tf.nest.flatten(c.layer(*call_args, **call_kwargs))
            for k, t in zip(c.outputs, out):
                values[k] = t
        return self.flavor.functional_model(start, values[target], f"{self.model.name}_{name}")


def is_random_op(op_type):
    """Whether ops of `op_type` draw random numbers (stateful or stateless)."""
    return bool(_RANDOM_OP.search(op_type))


def random_ops_by_scope(graph_def):
    """The random op types a traced model call runs, by the scope below the model's own
    that made them (a layer's name; None for ops outside any layer): each node of the graph
    counts with the random ops of the functions it calls (its attributes' functions, or its
    op type when that names one), nested as deep as they go."""
    library = {f.signature.name: f for f in graph_def.library.function}
    memo = {}

    def in_function(name):
        if name not in memo:
            memo[name] = set()  # a function that calls itself adds nothing more
            memo[name] = set().union(*(in_node(n) for n in library[name].node_def))
        return memo[name]

    def in_node(node):
        found = {node.op} if is_random_op(node.op) else set()
        called = [node.op] if node.op in library else []
        for value in node.attr.values():
            if value.HasField("func"):
                called.append(value.func.name)
            called += [f.name for f in value.list.func]
        for name in called:
            if name in library:
                found |= in_function(name)
        return found

    out = {}
    for node in graph_def.node:
        ops = in_node(node)
        if ops:
            parts = node.name.split("/")
            out.setdefault(parts[1] if len(parts) > 2 else None, set()).update(ops)
    return out


def is_batch_dependent(layer, flavor):
    """Whether `layer` (of `flavor`'s Keras) gives one example an output that depends on the
    rest of its batch in training mode (BatchNorm's batch statistics; a layer not trainable,
    or one --bn_mode inference put in inference mode, runs on its moving statistics)."""
    return (isinstance(layer, batchnorm.batch_norm_types(flavor)) and layer.trainable
            and not batchnorm.in_inference(layer))


def _weights(layer, trainable=False):
    """A call's layer's (trainable) weights; none for a Keras 3 operation that is no layer."""
    return list(getattr(layer, "trainable_weights" if trainable else "weights", None) or [])


def call_cost(call):
    """A call's forward cost, estimated: two per multiply-add of each kernel (weights of two
    or more dimensions) at every output position, plus ELEMENT_COST per output element."""
    elements = 0
    channels = 1
    for t in call.tensors or []:
        shape = [d for d in t.shape[1:]]
        if None in shape:
            continue
        elements += int(np.prod(shape)) if shape else 1
        channels = shape[-1] if shape else 1
    positions = elements / max(channels, 1)
    macs = sum(int(np.prod(w.shape)) for w in _weights(call.layer) if len(w.shape) >= 2)
    return 2.0 * macs * positions + ELEMENT_COST * elements
