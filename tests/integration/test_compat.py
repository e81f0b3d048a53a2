"""compat.py: each private-API function does on this TensorFlow / tf-keras what the public
behaviour it stands in for implies, and no other module of the package reaches private API."""
import ast
import importlib.util
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


# -- nothing else reaches private API ---------------------------------------------------------

# Private attributes that are the project's own, set or defined where the checker below cannot
# tell from `self`/`cls`: name -> why it is ours.
OWN_PRIVATE_ATTRIBUTES = {
    "_tensor_steps": "optimizers.prepare_optimizer's per-tensor Adam step counts, kept on the "
                     "optimizer",
    "_adam_update_xla": "train_steps._apply's XLA-compiled train_steps._adam_update, cached on the "
                        "optimizer",
    "_names": "profiler.table.TimingTable's own classmethod",
    "_get_help_string": "the hook argparse's HelpFormatter subclasses override "
                        "(common.DefaultsHelpFormatter); Python's argparse, not TensorFlow",
}
# Module paths that are not TensorFlow's or Keras' public API.
PRIVATE_MODULE_PREFIXES = ("tensorflow.python", "tensorflow.tsl", "tensorflow.core",
                           "tensorflow.compiler", "tf_keras.src", "keras.src")
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}


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


def private_uses(tree, defined, allowed=OWN_PRIVATE_ATTRIBUTES):
    """(line, what) for each private TensorFlow / Keras name `tree` reaches: an attribute
    `x._name` (or getattr & co. with a "_name" string, or __dict__["_name"]) that is neither
    `self`/`cls`'s own (in `defined`) nor in `allowed`, and imports from PRIVATE_MODULE_PREFIXES
    or any module path with a private part."""
    found = []

    def check(receiver, name, line):
        if not _is_private(name):
            return
        own = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
        if (own and name in defined) or name in allowed:
            return
        found.append((line, name))

    def private_module(module):
        return (module.startswith(PRIVATE_MODULE_PREFIXES)
                or any(_is_private(part) for part in module.split(".")))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            check(node.value, node.attr, node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) \
                and node.func.id in ATTRIBUTE_FUNCTIONS and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            check(node.args[0], node.args[1].value, node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "__dict__" and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            check(node.value.value, node.slice.value, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "__dict__" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            check(node.func.value.value, node.args[0].value, node.lineno)
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and private_module(node.module):
            found.append((node.lineno, node.module))
    return found


def _package_sources():
    sources = {}
    for path in package_files():
        with open(path) as fh:
            sources[os.path.relpath(path, ROOT)] = ast.parse(fh.read())
    return sources


def test_no_module_but_compat_uses_private_api():
    sources = _package_sources()
    compat_path = os.path.join("elastictrainer", "compat.py")
    assert compat_path in sources and len(sources) > 20
    others = {p: t for p, t in sources.items() if p != compat_path}
    defined = _defined_names(others.values())
    found = [f"{path}:{line}: {what}" for path, tree in sorted(others.items())
             for line, what in private_uses(tree, defined)]
    assert not found, "private API outside compat.py:\n" + "\n".join(found)
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
            "super()._private_method()\n")
    uses = private_uses(ast.parse(code), defined=set())
    assert sorted(line for line, _ in uses) == [1, 2, 3, 4, 5, 6, 7], uses
    own = ("self._steps = {}\nself._steps.clear()\ngetattr(self, '_steps', None)\n"
           "optimizer._tensor_steps\nclass A:\n    def _helper(self):\n        self._helper()\n")
    tree = ast.parse(own)
    assert private_uses(tree, _defined_names([tree])) == []


def test_steps_per_execution_is_what_compile_was_given():
    model = tiny_model()
    assert compat.steps_per_execution(model) == 1  # not compiled
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    assert compat.steps_per_execution(model) == 3
