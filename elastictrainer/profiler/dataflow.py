"""Graph dataflow of a traced training step: which trainable tensors need each op.

For every op of the graph we compute the set S of tensors whose gradient (or optimizer update)
needs it.  |S| = 1: the op is t_dw of that tensor.  |S| > 1: the op runs as soon as any tensor
in S trains, i.e. once the deepest selected tensor reaches the output-most member of S, so it
is t_dy of that member (attribution.py).  When S is a suffix of the output-back order (a chain)
this is exact; on branches it is the paper's prefix approximation.  No model-specific code.
"""
from collections import defaultdict

import numpy as np


def slot_owners(variables, optimizer_variables):
    """(slot variable, tensor index) pairs, from the names optimizers give slots: tf-keras
    '<slot>/<weight name>', Keras 3 '<weight path with _ for />_<slot>' (the longest matching
    weight wins)."""
    by_name, prefixes = {}, []
    for k, v in enumerate(variables):
        by_name.setdefault(v.name, k)
        path = getattr(v, "path", None)
        if isinstance(path, str):
            prefixes.append((path.replace("/", "_") + "_", k))
    prefixes.sort(key=lambda p: -len(p[0]))
    pairs = []
    for ov in optimizer_variables:
        parts = ov.name.split("/", 1)
        k = by_name.get(parts[1]) if len(parts) == 2 else None
        if k is None:
            k = next((j for prefix, j in prefixes if ov.name.startswith(prefix)), None)
        # a slot has its weight's shape; this project's per-tensor Adam step counts are scalars
        scalar_count = "tensor_steps" in ov.name and len(ov.shape) == 0
        if k is not None and (ov.shape == variables[k].shape or scalar_count):
            pairs.append((ov, k))
    return pairs


class GraphInfo:
    """Per-op classification of a traced training step.

    kind[name] is 'forward' (an ancestor of the loss), 'backward' (an ancestor of some weight
    gradient), 'update' (fed by a gradient or by a trainable variable outside the forward pass:
    the optimizer's work) or 'other'; mask[name] is the bit set S of trainable-tensor indices
    (model.trainable_weights order) that need the op.
    """

    def __init__(self, graph, loss, grads, variables, optimizer_variables=()):
        ops = graph.get_operations()  # creation order, which is topological for these graphs
        self.ops = {op.name: op for op in ops}
        self.n = len(variables)
        forward = set()
        stack = [loss.op]
        while stack:
            op = stack.pop()
            if op.name in forward:
                continue
            forward.add(op.name)
            stack.extend(t.op for t in op.inputs)
        self.forward = forward

        anc = defaultdict(int)
        for k, g in enumerate(grads):
            if g is not None:
                anc[g.op.name] |= 1 << k
        for op in reversed(ops):
            m = anc.get(op.name, 0)
            if m:
                for t in op.inputs:
                    anc[t.op.name] |= m

        # Descendant sets, tracked per output tensor: the optimizer's work for a tensor reads
        # its variable handle or its gradient.  Forward ops only emit their own handle bits and
        # backward ops only the gradients they produce, or every update would look shared.
        by_id = {id(v.handle): k for k, v in enumerate(variables)}
        for slot, k in slot_owners(variables, optimizer_variables):
            by_id[id(slot.handle)] = k  # momentum/Adam slots are that tensor's update work too
        handle_bits = defaultdict(int)
        for external, internal in graph.captures:
            k = by_id.get(id(external))
            if k is not None:
                handle_bits[internal.op.name] |= 1 << k
        grad_bits = defaultdict(int)
        for k, g in enumerate(grads):
            if g is not None:
                grad_bits[g.name] |= 1 << k
        out_mask, desc = {}, {}
        for op in ops:
            in_masks = [out_mask.get(t.name, 0) for t in op.inputs]
            m = handle_bits.get(op.name, 0)
            for x in in_masks:
                m |= x
            desc[op.name] = m
            for j, t in enumerate(op.outputs):
                if op.name in forward:
                    out_mask[t.name] = handle_bits.get(op.name, 0)
                elif anc.get(op.name, 0):
                    out_mask[t.name] = grad_bits.get(t.name, 0)
                elif op.type in ("Identity", "IdentityN") and j < len(in_masks):
                    out_mask[t.name] = in_masks[j]  # pass-through: output j is input j
                else:
                    out_mask[t.name] = m

        self.kind, self.mask = {}, {}
        for op in ops:
            name = op.name
            if name in forward:
                self.kind[name], self.mask[name] = "forward", 0
            elif anc.get(name, 0):
                self.kind[name], self.mask[name] = "backward", anc[name]
            elif desc.get(name, 0):
                self.kind[name], self.mask[name] = "update", desc[name]
            else:
                self.kind[name], self.mask[name] = "other", 0
        # Ops that read neither a gradient nor a tensor's variable but only feed the optimizer's
        # work (Adam's bias-correction powers of the iteration count, the learning rate of this
        # step) run exactly when the tensors whose updates consume them train.
        feeds = {}
        for op in reversed(ops):  # consumers before producers
            if self.kind[op.name] != "other":
                continue
            m = 0
            for t in op.outputs:
                for c in t.consumers():
                    if self.kind.get(c.name) == "update":
                        m |= self.mask[c.name]
                    else:
                        m |= feeds.get(c.name, 0)
            if m:
                feeds[op.name] = m
        for name, m in feeds.items():
            self.kind[name], self.mask[name] = "update", m
        # The forward pass's own side effects (BatchNorm's moving-average updates in training
        # mode: fused into one op by tf-keras, a chain of reads, products and assignments in
        # Keras 3) read only forward values and variables: they run in every step, whatever
        # trains.  `pure`: an op computed from such inputs only; it is a side effect when its
        # inputs reach a forward value, or when only side effects consume it (the moving
        # average's own read and decay).
        pure, touches = {}, {}
        for op in ops:
            if self.kind[op.name] != "other":
                continue
            sources = [t.op for t in op.inputs]
            pure[op.name] = all(self.kind[o.name] == "forward" or not o.inputs
                                or pure.get(o.name, False) for o in sources)
            touches[op.name] = pure[op.name] and any(
                self.kind[o.name] == "forward" or touches.get(o.name, False) for o in sources)
            if touches[op.name]:
                self.kind[op.name] = "forward"
        for op in reversed(ops):
            consumers = [c for t in op.outputs for c in t.consumers()]
            if (pure.get(op.name) and self.kind[op.name] == "other" and consumers
                    and all(self.kind.get(c.name) == "forward" and c.name not in forward
                            for c in consumers)):
                self.kind[op.name] = "forward"

        # The optimizer's own state (its step count's increment) reads no tensor's variable and
        # feeds no tensor's update, yet it runs in every step in which anything trains: work
        # shared by all tensors, not unattributed time.
        slots = {id(slot.handle) for slot, _ in slot_owners(variables, optimizer_variables)}
        own = {id(v.handle) for v in optimizer_variables} - slots
        state_ops = {internal.op.name for external, internal in graph.captures
                     if id(external) in own}
        everything = (1 << self.n) - 1
        for op in ops:
            if op.name not in state_ops and not any(t.op.name in state_ops for t in op.inputs):
                continue
            state_ops.add(op.name)
            if self.kind[op.name] == "other":
                self.kind[op.name], self.mask[op.name] = "update", everything

        # Backprop order: tape.gradient creates output-side gradients first, so the creation
        # position of each tensor's gradient op ranks tensors from the output back (rank 0).
        self.grad_ops = [g.op.name if g is not None else None for g in grads]
        position = {op.name: i for i, op in enumerate(ops)}
        key = [(position[g.op.name] if g is not None else len(ops), -k) for k, g in enumerate(grads)]
        order = sorted(range(self.n), key=lambda k: key[k])
        self.rank = [0] * self.n
        for r, k in enumerate(order):
            self.rank[k] = r

        self._scopes = None

    def lookup(self, name):
        """(kind, mask) of a traced op name; grappler-made names fall back to their name scope."""
        if name in self.kind:
            return self.kind[name], self.mask[name]
        if self._scopes is None:
            self._scopes = defaultdict(list)
            for op_name in self.kind:
                parts = op_name.split("/")
                for cut in range(1, len(parts)):
                    self._scopes["/".join(parts[:cut])].append(op_name)
        parts = name.split("/")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = "/".join(parts[:cut])
            if prefix in self.kind:  # a rewrite of one op keeps that op's name as its scope
                return self.kind[prefix], self.mask[prefix]
            members = self._scopes.get(prefix)
            if members:
                kinds = [self.kind[m] for m in members]
                if all(k == "forward" for k in kinds):
                    return "forward", 0
                mask = 0
                for m in members:
                    if self.kind[m] in ("backward", "update"):
                        mask |= self.mask[m]
                return ("backward", mask) if mask else ("other", 0)
        return None, 0

    def fused_cover(self, name, kernel_type):
        """Extra tensors a fused kernel computes the gradient of (oneDNN's ...WithBias kernels
        fold the BiasAddGrad that reads the same output gradient into the filter gradient)."""
        op = self.ops.get(name)
        if op is None or not kernel_type.endswith("WithBias"):
            return 0
        inputs = {t.name for t in op.inputs}
        cover = 0
        for t in op.inputs:
            for consumer in t.consumers():
                if consumer.type == "BiasAddGrad" and consumer.inputs[0].name in inputs:
                    cover |= self.mask.get(consumer.name, 0)
        return cover

    def dw_flops(self, variables, batch_size):
        """Rough FLOPs of each tensor's exclusive gradient work: 2 x |w| x positions summed over,
        taken from the static shapes of the inputs of its exclusive backward ops."""
        positions = [0] * self.n
        for name, kind in self.kind.items():
            m = self.mask[name]
            if kind != "backward" or m & (m - 1):
                continue
            k = m.bit_length() - 1
            for t in self.ops[name].inputs:
                shape = t.shape
                if shape.rank and shape.rank >= 2 and shape.is_fully_defined():
                    dims = shape.as_list()
                    positions[k] = max(positions[k], int(np.prod(dims[:-1])))
        return [2.0 * int(np.prod(v.shape)) * (positions[k] or batch_size)
                for k, v in enumerate(variables)]
