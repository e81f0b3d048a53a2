"""flavors/compat/: each private-API function does on this TensorFlow / tf-keras what the public
behaviour it stands in for implies, and no module of the package outside it reaches private API."""
import ast
import importlib
import importlib.util
import inspect
import re
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorflow as tf
import tf_keras as keras

from helpers import ROOT, batch, package_files, tiny_model
from elastictrainer.flavors import compat
from elastictrainer.flavors import optimizers


pytestmark = pytest.mark.tf_versions



def _sgd():
    return optimizers.make_optimizer("sgd", 0.1, 5e-2, 10)  # momentum, weight decay, cosine lr


def _adam():
    return optimizers.make_optimizer("adam", 0.05, 0.0, 10)


def _built(optimizer, variables):
    optimizer.build(variables)
    compat.compute_current_learning_rate(optimizer)
    return optimizer


# -- tf-keras optimizer -----------------------------------------------------------------------

def test_the_optimizers_make_optimizer_builds_have_every_private_method():
    for optimizer in (_sgd(), _adam()):
        assert compat.missing_optimizer_api(optimizer) == []
        assert not compat.is_dtensor_optimizer(optimizer)
    assert compat.missing_optimizer_api(object()) == list(compat.OPTIMIZER_PRIVATE_API)


def test_var_key_is_stable_and_distinct_per_variable():
    model = tiny_model()
    optimizer = _built(_sgd(), model.trainable_weights)
    keys = [compat.var_key(optimizer, v) for v in model.trainable_weights]
    assert len(set(keys)) == len(keys)
    assert keys == [compat.var_key(optimizer, v) for v in model.trainable_weights]


def test_compute_current_learning_rate_sets_the_schedules_value_at_the_iteration():
    variable = tf.Variable(tf.ones([3]))
    optimizer = _built(_sgd(), [variable])
    schedule = keras.optimizers.schedules.CosineDecay(0.1, 10)  # make_optimizer's for sgd
    for step in (0, 4, 9):
        optimizer.iterations.assign(step)
        compat.compute_current_learning_rate(optimizer)
        np.testing.assert_allclose(float(optimizer.learning_rate), float(schedule(step)),
                                   rtol=1e-6)
    assert float(schedule(9)) < float(schedule(0))


def test_clip_gradients_clips_as_configured_and_leaves_unclipped_alone():
    grads = [tf.constant([3.0, 4.0])]
    np.testing.assert_allclose(compat.clip_gradients(_sgd(), grads)[0], [3.0, 4.0])
    clipped = compat.clip_gradients(keras.optimizers.SGD(0.1, clipnorm=1.0), grads)[0]
    np.testing.assert_allclose(clipped, [0.6, 0.8], rtol=1e-6)


def test_deduplicate_sparse_grad_sums_repeated_indices():
    sparse = tf.IndexedSlices(tf.constant([[1.0], [2.0], [5.0]]), tf.constant([0, 2, 0]),
                              tf.constant([3, 1]))
    dense = tf.constant([1.0, 2.0])
    out_sparse, out_dense = compat.deduplicate_sparse_grad(_sgd(), [sparse, dense])
    np.testing.assert_allclose(tf.convert_to_tensor(out_sparse), [[6.0], [0.0], [2.0]])
    assert len(out_sparse.indices) == 2
    np.testing.assert_allclose(out_dense, dense)


def test_use_weight_decay_follows_the_exclusions():
    kept, excluded = tf.Variable(tf.ones([2])), tf.Variable(tf.ones([2]))
    optimizer = _sgd()
    optimizer.exclude_from_weight_decay(var_list=[excluded])
    _built(optimizer, [kept, excluded])
    assert compat.use_weight_decay(optimizer, kept)
    assert not compat.use_weight_decay(optimizer, excluded)


def test_update_step_and_its_xla_variant_take_sgds_first_momentum_step():
    g = tf.constant([1.0, -2.0, 0.5])
    a, b = tf.Variable(tf.ones([3])), tf.Variable(tf.ones([3]))
    optimizer = _built(_sgd(), [a, b])
    lr = float(optimizer.learning_rate)
    compat.update_step(optimizer, g, a)
    compat.update_step_xla(optimizer, g, b)
    expected = 1.0 - lr * g.numpy()  # the momentum starts at zero; no weight decay here
    np.testing.assert_allclose(a.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), expected, rtol=1e-6)


def test_adam_slots_are_the_variables_moments():
    model = tiny_model()
    variables = model.trainable_weights
    optimizer = _built(_adam(), variables)
    assert compat.has_adam_slots(optimizer) and not compat.has_adam_slots(_sgd())
    for v in variables:
        m, v2, v_hat = compat.adam_slots(optimizer, v)
        assert m.shape == v.shape and v2.shape == v.shape and v_hat is None
    # the slots update_step writes: m = (1 - beta_1) g, v = (1 - beta_2) g^2 after one step
    target = variables[0]
    g = tf.fill(target.shape, 0.5)
    compat.update_step(optimizer, g, target)
    m, v2, _ = compat.adam_slots(optimizer, target)
    np.testing.assert_allclose(m.numpy(), (1 - optimizer.beta_1) * 0.5, rtol=1e-5)
    np.testing.assert_allclose(v2.numpy(), (1 - optimizer.beta_2) * 0.25, rtol=1e-5)
    amsgrad = keras.optimizers.Adam(0.05, amsgrad=True)
    _built(amsgrad, [target])
    assert compat.adam_slots(amsgrad, target)[2].shape == target.shape


# -- tf.function, AutoGraph, profiler ---------------------------------------------------------

def test_concrete_functions_grows_with_each_trace():
    @tf.function
    def double(x):
        return 2 * x

    assert len(compat.concrete_functions(double)) == 0
    double(tf.constant([1.0]))
    assert len(compat.concrete_functions(double)) == 1
    double(tf.constant([1.0]))  # same signature: no new trace
    assert len(compat.concrete_functions(double)) == 1
    double(tf.constant([[1.0]]))
    fns = compat.concrete_functions(double)
    assert len(fns) == 2 and all(f.graph.as_graph_def().node for f in fns)


def _probe_module(tmp_path, name):
    """A module `name` whose function branches in Python on a tensor (AutoGraph must convert
    it to trace it)."""
    path = tmp_path / f"{name}.py"
    path.write_text("def relu(x):\n    if x > 0:\n        return x\n    return 0.0 * x\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_autograph_do_not_convert_leaves_that_modules_code_unconverted(tmp_path):
    from tensorflow.python.autograph.core import config as ag_config

    converted = _probe_module(tmp_path, "compat_probe_converted")
    skipped = _probe_module(tmp_path, "compat_probe_skipped")
    try:
        compat.autograph_do_not_convert("compat_probe_skipped")
        rules = len(ag_config.CONVERSION_RULES)
        compat.autograph_do_not_convert("compat_probe_skipped")  # once is enough
        assert len(ag_config.CONVERSION_RULES) == rules
        assert float(tf.function(lambda x: converted.relu(x))(tf.constant(2.0))) == 2.0
        with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
            tf.function(lambda x: skipped.relu(x))(tf.constant(2.0))
    finally:
        del sys.modules["compat_probe_converted"], sys.modules["compat_probe_skipped"]


def test_tf_keras_is_left_unconverted_after_tf_setup():
    from tensorflow.python.autograph.core import config as ag_config

    before = len(ag_config.CONVERSION_RULES)
    compat.autograph_do_not_convert("tf_keras")  # tf_setup already did
    assert len(ag_config.CONVERSION_RULES) == before


def test_xplane_module_parses_an_xspace():
    pb = compat.xplane_pb2()
    space = pb.XSpace()
    plane = space.planes.add(name="/host:CPU", id=1)
    plane.event_metadata[7].name = "dense/MatMul:MatMul"
    plane.lines.add(name="executor").events.add(metadata_id=7, duration_ps=2_000_000_000)
    parsed = pb.XSpace.FromString(space.SerializeToString())
    assert parsed == space
    assert parsed.planes[0].lines[0].events[0].duration_ps == 2_000_000_000


# -- tf-keras layers --------------------------------------------------------------------------

def test_keras_history_of_a_model_output_is_its_last_layer():
    model = tiny_model()
    history = compat.keras_history(model.outputs[0])
    assert history.layer is model.layers[-1]
    assert compat.keras_history(tf.constant(1.0)) is None


def test_layer_input_tensors_are_what_the_layer_was_called_with():
    model = tiny_model()
    head = model.layers[-1]
    history = compat.keras_history(model.outputs[0])
    inputs = tf.nest.flatten(compat.layer_input_tensors(head, history.node_index))
    assert len(inputs) == 1 and inputs[0] is head.get_input_at(history.node_index)
    assert compat.keras_history(inputs[0]).layer is model.layers[-2]


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_node_call_gives_the_layer_arguments_and_tensors_of_a_call(flavor):
    """tf_keras_node_call / keras3_node_call: the call that made a functional model's tensor,
    with the arguments the graph passed (a nested model's training=False) and its tensors."""
    k = keras if flavor == "tf_keras" else importlib.import_module("keras")
    node_call = getattr(compat, f"{flavor}_node_call")
    inner = k.Input((3,))
    backbone = k.Model(inner, k.layers.Dense(4, name="dense")(inner), name="backbone")
    image = k.Input((3,))
    features = backbone(image, training=False)
    model = k.Model(image, k.layers.Dense(2, name="head")(features))
    layer, node, args, kwargs, inputs, outputs, is_input = node_call(model.outputs[0])
    assert layer is model.get_layer("head") and not is_input
    assert inputs == [features] and args[0] is features and outputs == [model.outputs[0]]
    layer, node, args, kwargs, inputs, outputs, is_input = node_call(features)
    assert layer is backbone and kwargs.get("training") is False and inputs == [image]
    assert node_call(image)[-1]  # the model's input: an input layer's call
    assert node_call(inner)[0] is not node_call(image)[0]  # each input its own layer



def test_own_trainable_weights_leave_out_the_sublayers():
    model = tiny_model()
    head = model.get_layer("head")
    assert compat.own_trainable_weights(head) == head.trainable_weights
    assert compat.own_trainable_weights(model) == [] and model.trainable_weights
    assert compat.own_trainable_weights(object()) == []


def test_layer_name_scope_is_where_the_layer_names_its_weights():
    layer = keras.layers.Dense(3, name="probe_dense")
    assert compat.layer_name_scope(layer) == "probe_dense/"
    with tf.name_scope("outer"):
        assert compat.layer_name_scope(layer) == "outer/probe_dense/"
    with tf.name_scope(compat.layer_name_scope(layer)):
        weight = tf.Variable(1.0, name="w")
    assert weight.name.startswith("probe_dense/w")


def test_layer_random_generator_holds_the_state_that_draws_advance():
    flip = keras.layers.RandomFlip("horizontal")
    images = batch()[0]
    flip(images, training=True)
    generator = compat.layer_random_generator(flip)
    assert isinstance(generator, tf.random.Generator)
    before = generator.state.numpy().copy()
    flip(images, training=True)
    assert not np.array_equal(generator.state.numpy(), before)
    assert compat.layer_random_generator(keras.layers.Dense(2)) is None


def test_is_random_layer_tells_augmentation_dropout_and_noise_from_the_rest():
    for layer in (keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.2),
                  keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.1)):
        assert compat.is_random_layer(layer), layer
    for layer in (keras.layers.Dense(2), keras.layers.BatchNormalization(),
                  keras.layers.Rescaling(0.5), keras.layers.ReLU()):
        assert not compat.is_random_layer(layer), layer


def test_tensorboard_without_tensorflow():
    # with TensorFlow loaded (as here) it leaves TensorBoard alone
    compat.tensorboard_without_tensorflow()
    assert "tensorboard.compat.notf" not in sys.modules
    probe = ("import sys\nfrom elastictrainer.flavors import compat\n"
             "compat.tensorboard_without_tensorflow()\n"
             "from tensorboard.compat import tf\n"
             "from tensorboard.backend.event_processing import event_accumulator\n"
             "tf.io.gfile.exists('.')\n"
             "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
             "assert 'tensorboard.compat.tensorflow_stub' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# -- model.fit and TensorBoard ----------------------------------------------------------------

def test_answer_tf_keras_batch_hooks_makes_a_keras3_callback_run_in_a_tf_keras_fit():
    import keras as keras3

    class Count(keras3.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            assert not isinstance(logs["loss"], tf.Tensor)  # numbers, as asked

    plain, answering = Count(), Count()
    compat.answer_tf_keras_batch_hooks(answering, train=True)
    with pytest.raises(AttributeError, match="_implements_train_batch_hooks"):
        keras.callbacks.CallbackList([plain])  # tf-keras asks every callback
    hooks = keras.callbacks.CallbackList([answering])
    assert hooks._should_call_train_batch_hooks and not hooks._should_call_test_batch_hooks
    model = tiny_model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = batch()
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[answering])
    assert answering.batches == -(-len(x) // 2)


def test_replace_train_function_runs_the_given_step_for_each_batch_and_restores():
    model = tiny_model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = batch()
    calls = []

    class Swap(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.saved = compat.replace_train_function(self.model, self.step)
            assert self.model.train_tf_function == self.step

        def step(self, iterator):
            calls.append(next(iterator))
            return {"loss": tf.constant(0.0)}

        def on_train_end(self, logs=None):
            compat.restore_train_function(self.model, self.saved)

    before = [w.numpy() for w in model.trainable_weights]
    swap = Swap()
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[swap])
    assert len(calls) == -(-len(x) // 2)
    for w, b in zip(model.trainable_weights, before):  # Keras' own step never ran
        np.testing.assert_array_equal(w.numpy(), b)
    assert model.train_function is swap.saved[0] and model.train_tf_function is swap.saved[1]


def test_load_events_reads_every_scalar_and_tensor_event(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in range(25):  # more than the accumulator keeps by default
            tf.summary.write("mask", tf.constant([step, 1]), step=step)
    writer.flush()
    events = compat.load_events(tmp_path).Tensors("mask")
    assert len(events) == 25
    np.testing.assert_array_equal(compat.tensor_event_array(events[-1]), [24, 1])


# -- layer calls ------------------------------------------------------------------------------

def _flavor_keras(flavor):
    if flavor == "keras3":
        import keras as keras3

        return keras3
    return keras


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_forcing_a_call_argument_wins_over_what_the_caller_passes(flavor):
    keras = _flavor_keras(flavor)
    layer = keras.layers.BatchNormalization()
    x = tf.constant(np.random.default_rng(0).uniform(0, 255, (4, 8, 8, 3)), tf.float32)
    layer(x, training=False)
    before = layer.moving_mean.numpy().copy()
    assert compat.force_call_argument(layer, "training", False)
    # Keras 3 refuses `training` by position in __call__; `call` itself takes it so
    for out in (layer(x, training=True), layer.call(x, True), layer.call(x, training=True)):
        np.testing.assert_allclose(out, layer(x, training=False), rtol=1e-6)
    np.testing.assert_array_equal(layer.moving_mean.numpy(), before)
    assert not compat.force_call_argument(keras.layers.ReLU(), "no_such_argument", 1)
    compat.release_call_argument(layer)
    layer(x, training=True)
    assert not np.array_equal(layer.moving_mean.numpy(), before)


# -- nothing else reaches private API ---------------------------------------------------------

# Private attributes that are the project's own, set or defined where the checker below cannot
# tell from `self`/`cls`: name -> why it is ours.
OWN_PRIVATE_ATTRIBUTES = {
    "_tensor_steps": "optimizers.prepare_optimizer's per-tensor Adam step counts, kept on the "
                     "optimizer",
    "_adam_update_xla": "train_steps._apply's XLA-compiled train_steps._adam_update, cached on the "
                        "optimizer",
    "_names": "profiler.table_format.TimingTable's own classmethod",
    "_get_help_string": "the hook argparse's HelpFormatter subclasses override "
                        "(config.flags.DefaultsHelpFormatter); Python's argparse, not TensorFlow",
    "_exit": "os._exit, Python's documented exit without teardown (the profiling child ends "
             "so once its table is written); not TensorFlow",
}
# Module paths that are not TensorFlow's, Keras' or TensorBoard's public API.
PRIVATE_MODULE_PREFIXES = ("tensorflow.python", "tensorflow.tsl", "tensorflow.core",
                           "tensorflow.compiler", "tf_keras.src", "keras.src")
# TensorBoard's public Python API; the rest of the tensorboard package is its own internals.
PUBLIC_TENSORBOARD = ("tensorboard.summary", "tensorboard.data", "tensorboard.program",
                      "tensorboard.plugins.hparams.api")
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}
FRAMEWORKS = ("tensorflow", "keras", "tf_keras")
# Keras' public modules whose classes a user subclasses; a class of one Keras may be handed to
# the other's fit (ElasticCallback is a Keras 3 callback that runs in tf-keras' fit too), so a
# subclass of either's class reaches the private names of both.
KERAS_KINDS = ("callbacks", "layers", "models", "optimizers", "losses", "metrics")


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(trees):
    """Private names the package defines itself: its functions, classes and class attributes,
    and what it assigns to self._x / cls._x."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Name):
                            names.add(sub.id)
                        elif (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                              and sub.value.id in ("self", "cls")):
                            names.add(sub.attr)
    return {n for n in names if _is_private(n)}


def _imported_names(tree):
    """name -> the dotted path it was imported as, for every import in `tree`."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                names[a.asname or root] = a.name if a.asname else root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(expr):
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return [expr.id] + parts[::-1] if isinstance(expr, ast.Name) else None


def _live(path):
    """The object at dotted `path` (its longest importable module, then attributes); None when
    there is none."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def _framework_private_names(cls):
    """Every private name in the sources of `cls`'s TensorFlow / Keras classes and of the other
    Keras' class of the same name: what the framework may read or write on such an object."""
    def framework(k):
        return k.__module__.split(".")[0] in FRAMEWORKS

    classes = [k for k in cls.__mro__ if framework(k)]
    for lib in ("keras", "tf_keras"):
        module = importlib.import_module(lib)
        for kind in KERAS_KINDS:
            other = getattr(getattr(module, kind, None), cls.__name__, None)
            if isinstance(other, type):
                classes += [k for k in other.__mro__ if framework(k)]
    names = set()
    for k in classes:
        names |= {n for n in dir(k) if _is_private(n)}
        source = inspect.getsourcefile(k)
        if source:
            with open(source) as fh:
                names |= set(re.findall(r"\b(_[A-Za-z]\w*)", fh.read()))
    return {n for n in names if _is_private(n)}


def framework_classes(trees):
    """{ClassDef node: the private names its TensorFlow / Keras bases' framework uses (None when
    a base cannot be resolved, so that every private name counts)} for each class in `trees`
    that derives, directly or through the package's own classes, from a TensorFlow or Keras
    class."""
    package_classes = {}  # name -> (ClassDef, that module's imports)
    for tree in trees:
        imports = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                package_classes.setdefault(node.name, (node, imports))
    result, seen = {}, set()

    def resolve(node, imports):
        if node.name in seen:
            return result.get(node)
        seen.add(node.name)
        derived, names = False, set()
        for base in node.bases:
            parts = _dotted(base)
            if parts is None:  # a call or other expression: which class it is is unknown
                derived, names = True, None
                continue
            path = ".".join([imports.get(parts[0], parts[0])] + parts[1:])
            if path.split(".")[0] in FRAMEWORKS:
                live = _live(path)
                derived = True
                if names is not None:
                    names = (names | _framework_private_names(live)
                             if isinstance(live, type) else None)
            elif parts[-1] in package_classes and (
                    len(parts) == 1 or path.startswith("elastictrainer.")):
                inner = resolve(*package_classes[parts[-1]])
                if package_classes[parts[-1]][0] in result:
                    derived = True
                    names = None if names is None or inner is None else names | inner
        if derived:
            result[node] = names
        return names

    for node, imports in list(package_classes.values()):
        resolve(node, imports)
    return result


def _nodes_in_classes(tree):
    """(node, innermost enclosing ClassDef or None) for every node of `tree`."""
    stack = [(tree, None)]
    while stack:
        node, cls = stack.pop()
        yield node, cls
        inner = node if isinstance(node, ast.ClassDef) else cls
        stack += [(child, inner) for child in ast.iter_child_nodes(node)]


def private_uses(tree, defined, frameworks, allowed=OWN_PRIVATE_ATTRIBUTES):
    """(line, what) for each private TensorFlow / Keras / TensorBoard name `tree` reaches:

    - an attribute `x._name` (or getattr & co. with a "_name" string, or __dict__["_name"])
      that is neither `self`/`cls`'s own nor in `allowed`.  `self`'s own are the names the
      package defines (`defined`); in a class that derives from a TensorFlow or Keras class
      (`frameworks`, from framework_classes) `self` is that framework's object, so a name its
      framework also uses is not the class's own;
    - a method or class attribute of such a class named as one of its framework's private
      names (an override of the framework's private protocol);
    - imports from PRIVATE_MODULE_PREFIXES, of TensorBoard other than PUBLIC_TENSORBOARD, or of
      any module path with a private part."""
    found = []

    def check(receiver, name, line, cls):
        if not _is_private(name) or name in allowed:
            return
        own = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
        if own and name in defined:
            if cls not in frameworks:
                return
            names = frameworks[cls]
            if names is not None and name not in names:
                return
        found.append((line, name))

    def private_module(module):
        if module.split(".")[0] == "tensorboard":
            return not any(module == p or module.startswith(p + ".") for p in PUBLIC_TENSORBOARD)
        return (module.startswith(PRIVATE_MODULE_PREFIXES)
                or any(_is_private(part) for part in module.split(".")))

    for node, cls in _nodes_in_classes(tree):
        if cls in frameworks and node is not cls and cls is not None:
            names = frameworks[cls]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
                if _is_private(node.name) and (names is None or node.name in names):
                    found.append((node.lineno, node.name))
            elif isinstance(node, ast.Assign) and node in cls.body:
                for t in node.targets:
                    if isinstance(t, ast.Name) and _is_private(t.id) and (
                            names is None or t.id in names):
                        found.append((node.lineno, t.id))
        if isinstance(node, ast.Attribute):
            check(node.value, node.attr, node.lineno, cls)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) \
                and node.func.id in ATTRIBUTE_FUNCTIONS and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            check(node.args[0], node.args[1].value, node.lineno, cls)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "__dict__" and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            check(node.value.value, node.slice.value, node.lineno, cls)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "__dict__" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            check(node.func.value.value, node.args[0].value, node.lineno, cls)
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and (
                any(private_module(f"{node.module}.{a.name}") for a in node.names)
                if node.module.split(".")[0] == "tensorboard" else private_module(node.module)):
            found.append((node.lineno, node.module))
    return sorted(found)


def _uses_in(code):
    tree = ast.parse(code)
    return private_uses(tree, _defined_names([tree]), framework_classes([tree]))


# The package where private API lives: every module under it is exempt from the check.
COMPAT_DIR = os.path.join("elastictrainer", "flavors", "compat") + os.sep


def _package_sources():
    sources = {}
    for path in package_files():
        with open(path) as fh:
            sources[os.path.relpath(path, ROOT)] = ast.parse(fh.read())
    return sources


def _compat_sources(sources):
    return {p: t for p, t in sources.items() if p.startswith(COMPAT_DIR)}


def test_no_module_but_compat_uses_private_api():
    sources = _package_sources()
    compat_sources = _compat_sources(sources)
    # the package's own files only (a flavors/compat_x.py is checked like any other module)
    assert os.path.join(COMPAT_DIR, "__init__.py") in compat_sources and len(compat_sources) > 3
    assert len(sources) - len(compat_sources) > 20
    others = {p: t for p, t in sources.items() if p not in compat_sources}
    defined = _defined_names(others.values())
    frameworks = framework_classes(others.values())
    # the package's Keras subclasses are seen as such (the callback, the ViT's and the
    # preprocessing layers)
    assert {"ElasticCallback", "ClassToken", "ImagenetPreprocess"} <= {c.name for c in frameworks}
    found = [f"{path}:{line}: {what}" for path, tree in sorted(others.items())
             for line, what in private_uses(tree, defined, frameworks)]
    assert not found, "private API outside flavors/compat/:\n" + "\n".join(found)
    # every allow-listed name is still used somewhere, so the list stays honest
    used = {n.attr for t in others.values() for n in ast.walk(t) if isinstance(n, ast.Attribute)}
    strings = {n.value for t in others.values() for n in ast.walk(t)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert set(OWN_PRIVATE_ATTRIBUTES) <= used | strings


def test_the_private_api_checker_finds_each_kind_of_use():
    code = ("from tensorflow.python.autograph.core import config\n"
            "import tf_keras.src.engine.base_layer\n"
            "optimizer._var_key(v)\n"
            "getattr(layer, '_trainable_weights', [])\n"
            "self._name_scope()\n"
            "optimizer.__dict__['_velocities']\n"
            "super()._private_method()\n"
            "from tensorboard.backend.event_processing import event_accumulator\n"
            "from tensorboard.compat.proto import event_pb2\n")
    assert [line for line, _ in _uses_in(code)] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert _uses_in("from tensorboard.plugins.hparams import api\nimport tensorboard.summary\n"
                    "from tensorboard.data import experimental\n") == []
    own = ("self._steps = {}\nself._steps.clear()\ngetattr(self, '_steps', None)\n"
           "optimizer._tensor_steps\nclass A:\n    def _helper(self):\n        self._helper()\n")
    assert _uses_in(own) == []


# What the callback did before its private API moved to compat: a Keras 3 callback that
# answers tf-keras' CallbackList itself, and a Keras layer touching its own base's private state.
OLD_CALLBACK = '''
import keras as _keras3
import tf_keras as keras

class ElasticCallback(_keras3.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self._supports_tf_logs = False
        self._global_step = 0

    def _implements_train_batch_hooks(self):
        return True

    def _setup(self):
        self._global_step += 1

class Scaled(keras.layers.Layer):
    _FACTORS = {"a": 2}

    def build(self, shape):
        self._trainable_weights = []
        self._own = self._FACTORS["a"]
'''


def test_the_checker_sees_private_names_of_keras_objects_on_self():
    uses = _uses_in(OLD_CALLBACK)
    lines = OLD_CALLBACK.splitlines()
    assert sorted({what for _, what in uses}) == [
        "_implements_train_batch_hooks", "_supports_tf_logs", "_trainable_weights"], uses
    for line, what in uses:
        assert what in lines[line - 1]
    # the same attributes in a class of the project's own are its own; a class deriving from a
    # Keras class through one of the project's is a Keras class
    assert _uses_in(OLD_CALLBACK.replace("(_keras3.callbacks.Callback)", "")
                    .replace("(keras.layers.Layer)", "")) == []
    derived = OLD_CALLBACK + "\nclass Mine(ElasticCallback):\n    def on_epoch_end(self, e):\n" \
                             "        self._supports_tf_logs = True\n"
    assert ("_supports_tf_logs" in [w for line, w in _uses_in(derived)
                                    if line == len(derived.splitlines())])
    # a base the checker cannot resolve (a call): every private name on self counts
    opaque = "import keras\nclass C(base()):\n    def f(self):\n        self._x = 1\n"
    assert _uses_in(opaque) == [(4, "_x")]


def test_the_current_callback_and_compat_agree_with_the_checker():
    # the package's callback passes, and compat's modules themselves (what they are for) do not
    sources = _package_sources()
    defined = _defined_names(sources.values())
    frameworks = framework_classes(sources.values())
    compat_uses = {path: {what for _, what in private_uses(tree, defined, frameworks)}
                   for path, tree in _compat_sources(sources).items()}
    every = set().union(*compat_uses.values())
    assert {"_supports_tf_logs", "_implements_train_batch_hooks", "_trainable_weights"} <= every
    assert "tensorboard.backend.event_processing" in every
    # each submodule holds private uses; the package's __init__ only re-exports them
    assert compat_uses.pop(os.path.join(COMPAT_DIR, "__init__.py")) == set()
    assert all(compat_uses.values()), compat_uses


def test_steps_per_execution_is_what_compile_was_given():
    model = tiny_model()
    assert compat.steps_per_execution(model) == 1  # not compiled
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    assert compat.steps_per_execution(model) == 3
