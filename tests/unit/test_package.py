"""The package's layout: installable names, no TensorFlow where none is needed, no import
cycles, and every name list taken from its registry."""
import ast
import os
import subprocess
import sys

import pytest

from helpers import ROOT, package_files


def _no_tensorflow(code):
    """Run `code` in a fresh Python; fail if it imported TensorFlow."""
    probe = code + "\nimport sys\nassert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


LIGHT_MODULES = ["elastictrainer", "elastictrainer.cli", "elastictrainer.errors", "elastictrainer.machine",
                 "elastictrainer.flavors.compat", "elastictrainer.config", "elastictrainer.method.schemes",
                 "elastictrainer.method.importance", "elastictrainer.method.selector",
                 "elastictrainer.method.time_model", "elastictrainer.runlog", "elastictrainer.experiments.cluster",
                 "elastictrainer.plotting", "elastictrainer.experiments.figures",
                 "elastictrainer.experiments.protocols", "elastictrainer.experiments.offline",
                 "elastictrainer.data",
                 "elastictrainer.models", "elastictrainer.profiler",
                 "elastictrainer.profiler.table", "elastictrainer.profiler.table_format",
                 "elastictrainer.profiler.calibration"]


def test_importing_the_light_modules_does_not_import_tensorflow():
    _no_tensorflow("\n".join(f"import {m}" for m in LIGHT_MODULES))


@pytest.mark.parametrize("argv", [
    ["main.py", "--help"], ["profiler.py", "--help"], ["plot.py", "--help"],
    ["plot.py", "bars", "--help"], ["scripts/bench_dp.py", "--help"],
    ["-m", "elastictrainer", "--help"], ["-m", "elastictrainer", "train", "--help"],
    ["-m", "elastictrainer", "profile", "--help"], ["-m", "elastictrainer", "figure", "--help"],
], ids=" ".join)
def test_help_does_not_import_tensorflow(argv):
    if argv[0] == "-m":
        run = (f"import runpy, sys\nsys.argv = ['elastictrainer'] + {argv[2:]!r}\n"
               "try:\n    runpy.run_module('elastictrainer', run_name='__main__')\n"
               "except SystemExit as e:\n    assert e.code in (0, None), e.code\n")
    else:
        run = (f"import runpy, sys\nsys.argv = {argv!r}\n"
               f"try:\n    runpy.run_path({argv[0]!r}, run_name='__main__')\n"
               "except SystemExit as e:\n    assert e.code in (0, None), e.code\n")
    r = _no_tensorflow(run)
    assert "usage:" in r.stdout


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def import_graph():
    """{module: set of elastictrainer modules it imports}, function-level imports included."""
    modules = {_module_name(path): path for path in package_files()}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:  # `from pkg import module` imports pkg.module
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if sub in modules else node.module)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def find_cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 20 and "elastictrainer.runs.loop" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the checker itself finds a cycle when there is one
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_sys_path_edits_in_scripts_and_tests():
    for folder in ("scripts", "tests", "elastictrainer"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith(".py") and f != "test_package.py":
                    assert "sys.path.insert" not in open(os.path.join(base, f)).read(), f


def test_choices_and_help_come_from_the_registries():
    from elastictrainer import cli, data, models
    from elastictrainer.method.schemes import SCHEMES

    train_help = cli.train_parser().format_help()
    for name in list(models.MODELS) + list(SCHEMES) + list(data.DATASET_NAMES):
        assert name in train_help, name
    assert "smallcnn" in cli.profile_parser().format_help()
    assert "(default: None)" not in train_help and "(default: the dataset's class" in train_help
    action = next(a for a in cli.train_parser()._actions if a.dest == "train_type")
    assert tuple(action.choices) == tuple(SCHEMES)


def test_a_scheme_carries_its_plot_label_and_colour():
    from elastictrainer import plotting
    from elastictrainer.method.schemes import SCHEMES

    for name, scheme in SCHEMES.items():
        assert plotting.scheme_label(name) == scheme.label
        style = plotting.scheme_styles([plotting.SchemeKey(name, 0.5 if scheme.elastic else None)])
        expected = scheme.color[1] if isinstance(scheme.color, tuple) else scheme.color
        assert next(iter(style.values())).color == expected


def test_console_command_and_bad_subcommand():
    r = subprocess.run([sys.executable, "-m", "elastictrainer", "trian"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "valid: train, profile, plot, compare, figure" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "elastictrainer"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "train" in r.stdout


def _script_parser(name):
    from helpers import load_script
    return load_script(name).build_parser()


def test_every_flag_has_help_and_no_default_is_printed_twice():
    from elastictrainer import cli

    parsers = [cli.train_parser(), cli.profile_parser(), cli.figure_parser(),
               _script_parser("bench_speedup"), _script_parser("bench_dp"),
               _script_parser("bench_fixed_selection"), _script_parser("bench_cache_views")]
    for p in parsers:
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{p.prog} {action.option_strings[0]} has no help"
        text = p.format_help()
        assert "(default: None)" not in text, p.prog
        for chunk in text.split("(default:")[1:]:  # a flag's help names its default once
            assert "default" not in chunk.split("\n  -")[0], p.prog


def _contract_layers():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")
    return [[name.strip() for name in layer.split("|")] for layer in layers["layers"]]


def test_the_layers_contract_covers_the_package_and_design_md_shows_it():
    """Every top-level module and sub-package stands in a layer of pyproject.toml's contract
    (a new one outside it would escape the check), and docs/design.md's layer table lists the
    same layers in the same order."""
    layers = _contract_layers()
    named = {name for layer in layers for name in layer}
    package = os.path.join(ROOT, "elastictrainer")
    present = {os.path.splitext(n)[0] for n in os.listdir(package)
               if (n.endswith(".py") and n not in ("__init__.py", "__main__.py"))
               or os.path.isfile(os.path.join(package, n, "__init__.py"))}
    assert present == named, (present ^ named)
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| layer (top first) |"):].split("\n\n")[0].splitlines()[2:]
    documented = [sorted(cell.strip(" `") for cell in row.split("|")[1].split(","))
                  for row in table]
    assert documented == [sorted(layer) for layer in layers]


def test_ci_checks_the_layers():
    """.ci/run runs lint-imports, which is installed by the project's own requirements."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "lint-imports" in f.read()
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        assert "import-linter" in f.read()


def test_ci_runs_the_readmes_test_command_with_what_the_requirements_install():
    """.ci/run's command is the README's second command, word for word, and its two test
    workers (-n 2) come from pytest-xdist, which both requirements files install."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line for line in f.read().splitlines() if line.startswith("python3 -m venv")]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = [line.strip() for line in f.read().splitlines()
                  if line.strip().startswith("python3 -m venv")]
    assert len(ci) == 1 and ci[0] in readme
    assert ci[0].count("pytest -q -n 2 --dist loadscope") == 2
    for name in ("requirements.txt", "requirements-tf216.txt"):
        with open(os.path.join(ROOT, name)) as f:
            assert "pytest-xdist" in f.read(), name
