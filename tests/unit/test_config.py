"""Config is the one declaration of the train command's settings: its fields make the flags,
their defaults and help, and docs/usage.md's flag table; the profile and figure commands' flags
are ProfileConfig's and FigureConfig's fields, made the same way."""
import dataclasses
import subprocess
import sys

import pytest

from elastictrainer import cli, config
from elastictrainer.config import Config
from elastictrainer.errors import UserError
from elastictrainer.flavors.optimizers import LR_SCHEDULES, OPTIMIZERS

FIELDS = dataclasses.fields(Config)


def _actions(parser):
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def test_every_field_is_a_flag_with_help():
    actions = _actions(cli.train_parser())
    for f in FIELDS:
        assert config.flag_of(f).help_text().strip(), f.name
        assert f.name in actions, f"Config.{f.name} has no flag"
        assert actions[f.name].option_strings == [config.option_of(f)]
        assert config.flag_of(f).help_text().replace("%", "%%") in actions[f.name].help
    assert set(actions) == {f.name for f in FIELDS}, "a train flag that is not a Config field"


def test_parser_defaults_are_configs_defaults():
    args = cli.train_parser().parse_args([])
    assert cli.config_from_args(args) == Config(progress=True)
    assert cli.config_from_args(cli.compare_parser().parse_args([])) == Config()


def test_flags_reach_the_config_with_their_types():
    cfg = cli.config_from_args(cli.train_parser().parse_args(
        ["--quiet", "--rho", "0.4", "--num_classes", "7", "--save_model", "yes",
         "--rho_feedback", "0", "--lr_schedule", "constant", "--dp_resolution", "500"]))
    assert cfg == Config(progress=False, rho=0.4, num_classes=7, save_model=True,
                         rho_feedback=False, lr_schedule="constant", dp_resolution=500)


def test_choices_come_from_the_registries():
    from elastictrainer.runs.energy import MODES
    from elastictrainer.method.schemes import SCHEMES

    actions = _actions(cli.train_parser())
    assert tuple(actions["train_type"].choices) == tuple(SCHEMES)
    assert tuple(actions["optimizer"].choices) == tuple(OPTIMIZERS)
    assert tuple(actions["lr_schedule"].choices) == tuple(LR_SCHEDULES)
    assert tuple(actions["energy"].choices) == tuple(MODES)
    assert tuple(actions["bn_mode"].choices) == ("model", "inference", "frozen")


def test_bn_mode_reaches_the_config_and_a_bad_one_is_a_one_line_user_error():
    args = cli.train_parser().parse_args(["--bn_mode", "inference"])
    assert cli.config_from_args(args).bn_mode == "inference"
    assert Config().bn_mode == "model"
    with pytest.raises(UserError, match=r"^unknown --bn_mode 'train'; valid: model, inference, frozen$"):
        Config(bn_mode="train").validate()  # elastictrainer.run(Config(...)) checks it so


def test_the_cache_settings_parse_and_bad_ones_are_one_line_user_errors():
    def parsed(*argv):
        return cli.config_from_args(cli.train_parser().parse_args(list(argv)))

    assert Config().cache_frozen_prefix == "auto" and parsed().cache_frozen_prefix == "auto"
    assert parsed("--cache_frozen_prefix", "true").cache_frozen_prefix is True
    assert parsed("--cache_frozen_prefix", "False").cache_frozen_prefix is False
    cfg = parsed("--cache_views", "3", "--cache_dtype", "float16")
    assert (cfg.cache_views, cfg.cache_dtype) == (3, "float16")
    for bad, message in ((dict(cache_views=-1), "--cache_views must be a whole number"),
                         (dict(cache_frozen_prefix="yes"), "must be auto, true or false"),
                         (dict(cache_frozen_prefix=True, strategy="mirrored"),
                          "trains on one device")):
        with pytest.raises(UserError, match=message):
            Config(**bad).validate()
    # auto under a strategy is no error: the run says in one line that it trains uncached
    Config(strategy="mirrored").validate()


def test_rho_objective_reaches_the_config_and_a_bad_one_is_a_one_line_user_error():
    args = cli.train_parser().parse_args(["--rho", "auto", "--rho_objective", "rate"])
    assert cli.config_from_args(args).rho_objective == "rate"
    assert Config().rho_objective == "share"  # until measurements choose the default
    with pytest.raises(UserError, match=r"^unknown --rho_objective 'fast'; valid: share, rate, gain$"):
        Config(rho_objective="fast").validate()
    # a numeric rho is the paper's budget: auto's settings beside it are refused, not ignored
    for extra, given in ((dict(rho_objective="gain"), "--rho_objective gain"),
                         (dict(rho_share=0.5), "--rho_share 0.5")):
        with pytest.raises(UserError, match=rf"^{given} chooses --rho auto's selections, but "
                                            rf"--rho 0.5 is the paper's budget"):
            Config(rho=0.5, **extra).validate()
        Config(rho="auto", **extra).validate()


def test_an_unknown_model_name_is_refused_with_the_flags_before_any_data_loads(monkeypatch):
    from elastictrainer.train import distribution

    # the first thing train_main does past the flags' checks
    monkeypatch.setattr(distribution, "prepare_process", lambda cfg: pytest.fail("went on"))
    with pytest.raises(UserError, match=r"^unknown model 'nosuch'; valid: .*resnet50"):
        cli.train_main(["--model_name", "nosuch"])  # CUB-200 by default, a TFDS download
    for name in ("MobileNetV2", " smallcnn", "mine.keras", "old.H5"):  # a file is checked on load
        Config(model_name=name).validate()


def test_head_warmup_is_auto_or_a_share_and_a_bad_one_is_a_one_line_user_error():
    assert Config().head_warmup == "auto"
    args = cli.train_parser().parse_args(["--head_warmup", "0.2"])
    assert cli.config_from_args(args).head_warmup == 0.2
    args = cli.train_parser().parse_args(["--head_warmup", "AUTO"])
    assert cli.config_from_args(args).head_warmup == "auto"
    with pytest.raises(UserError, match=r"^--head_warmup is a share"):
        Config(head_warmup=1.5).validate()


@pytest.mark.parametrize("argv,needle", [
    (["--rho", "half"], "--rho"),
    (["--optimizer", "lamb"], "--optimizer"),
    (["--resume", "maybe"], "--resume"),
    (["--save_txt", "maybe"], "--save_txt"),
    (["--quiet", "yes"], "unrecognized"),
    (["--bn_mode", "training"], "--bn_mode"),
    (["--train_type", "elastic"], "full_training"),  # the choices are listed
    (["--cache_frozen_prefix", "sometimes"],
     "--cache_frozen_prefix: expected auto, true or false, got 'sometimes'"),
    (["--cache_dtype", "int8"], "--cache_dtype"),
    (["--rho", "auto", "--rho_objective", "fastest"], "--rho_objective"),
    (["--head_warmup", "long"], "--head_warmup"),
])
def test_a_bad_value_is_one_line_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.train_parser("main.py").parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_config_imports_no_tensorflow():
    code = "import elastictrainer.config, sys; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_documented_flag_table_is_generated_from_config():
    text = open(config.USAGE_DOC, encoding="utf-8").read()
    block = config.documented_flag_table(text)
    assert block is not None, f"docs/usage.md lost its {config.TABLE_BEGIN} block"
    assert block == config.flag_table(), (
        "docs/usage.md's train flag table differs from Config's flags: run "
        "`python -m elastictrainer.config --write` and commit docs/usage.md")


def test_flag_table_shows_what_a_none_default_means():
    table = config.flag_table()
    for f in FIELDS:
        row = next(r for r in table.splitlines() if r.startswith(f"| `{config.option_of(f)}` |"))
        assert row.split(" | ")[1] not in ("None", ""), row
    assert "| `--quiet` | off | no progress bars |" in table
    assert "\\| synthetic" in table  # a "|" inside a help text does not split the row


def test_write_rewrites_only_the_block(tmp_path):
    path = tmp_path / "usage.md"
    path.write_text(f"# x\n\n{config.TABLE_BEGIN}\n| old |\n{config.TABLE_END}\n\ntail\n")
    assert config.write_flag_table(str(path)) is True
    assert path.read_text() == (f"# x\n\n{config.TABLE_BEGIN}\n{config.flag_table()}"
                                f"{config.TABLE_END}\n\ntail\n")
    assert config.write_flag_table(str(path)) is False


def test_a_scheme_registered_later_is_a_valid_train_type(monkeypatch):
    from elastictrainer.method.schemes import SCHEMES

    # a user's (or a benchmark's) own scheme, registered after config was imported
    monkeypatch.setitem(SCHEMES, "my_scheme", next(iter(SCHEMES.values())))
    args = cli.train_parser().parse_args(["--train_type", "my_scheme"])
    assert args.train_type == "my_scheme"


# -- the other commands' settings and ElasticCallback's come from elastictrainer.config too --

def _defaults(parser):
    return {dest: a.default for dest, a in _actions(parser).items()}


@pytest.mark.parametrize("parser, settings", [(cli.profile_parser, config.ProfileConfig),
                                              (cli.figure_parser, config.FigureConfig)])
def test_each_commands_flags_are_its_settings_fields(parser, settings):
    actions = _actions(parser())
    fields = {f.name: f for f in dataclasses.fields(settings)}
    assert set(actions) == set(fields), "a flag that is not a settings field, or the reverse"
    for name, f in fields.items():
        assert actions[name].option_strings == [config.option_of(f)]
        assert config.flag_of(f).help_text().replace("%", "%%") in actions[name].help
    assert settings(**_defaults(parser())) == settings()  # each flag's default is the field's


# where a profile flag means what train's does, its default differs only where said
# timings do not depend on the weights; the paper's figures keep its protocol, uncached
DEFAULTS_OF_THEIR_OWN = {("profile", "weights"): "none", ("figure", "cache_frozen_prefix"): False}
# flags of another command named as a train flag but meaning something else
SAME_NAME_OTHER_MEANING = {("figure", "logdir"): "the figure's run directories, logs/figures/FIG"}


def test_profile_and_figure_flags_shared_with_train_have_trains_defaults_and_choices():
    train = _actions(cli.train_parser())
    shared = 0
    for command, settings in (("profile", config.ProfileConfig), ("figure", config.FigureConfig)):
        actions = _actions(getattr(cli, f"{command}_parser")())
        for f in dataclasses.fields(settings):
            if f.metadata.get("same_as") is None:
                assert (f.name not in config.CONFIG_FIELDS
                        or (command, f.name) in SAME_NAME_OTHER_MEANING), (command, f.name)
                continue
            name, shared = f.metadata["same_as"], shared + 1
            expected = DEFAULTS_OF_THEIR_OWN.get((command, name), train[name].default)
            assert actions[f.name].default == expected, (command, name)
            assert actions[f.name].choices == train[name].choices, (command, name)
            assert actions[f.name].type == train[name].type, (command, name)
    assert shared == 12
    assert config.ProfileConfig().weights == "none" != Config().weights
    assert config.FigureConfig().cache_frozen_prefix is False != Config().cache_frozen_prefix


def test_profile_and_figure_checks_are_the_settings_checks(capsys):
    for argv, message in ((["profile", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
                          (["profile", "--num_iterations", "0"],
                           "--num_iterations must be a positive integer, got 0"),
                          (["profile", "--num_classes", "0"],
                           "--num_classes must be a positive integer, got 0"),
                          (["figure", "17", "--steps_per_epoch", "0"],
                           "--steps_per_epoch must be a positive integer, got 0"),
                          (["figure", "17", "--ray_resources", "pi4=1"], "needs --ray")):
        with pytest.raises(UserError, match=message.replace("-", r"\-")):
            cli.main(argv)
    with pytest.raises(UserError, match="--steps_per_epoch must be a positive integer"):
        Config(steps_per_epoch=0).validate()  # the same check as train's


def test_profile_num_classes_default_is_the_models_default():
    from elastictrainer.models import DEFAULT_NUM_CLASSES

    text = cli.profile_parser().format_help()
    assert f"(default: {DEFAULT_NUM_CLASSES}, as" in " ".join(text.split())


def test_strategy_choices_are_the_distribution_modules_strategies():
    from elastictrainer.train.distribution import STRATEGIES

    f = config.CONFIG_FIELDS["strategy"]
    assert config.flag_of(f).choice_list() == tuple(STRATEGIES)
    assert tuple(_actions(cli.train_parser())["strategy"].choices) == tuple(STRATEGIES)
    for name in STRATEGIES:
        assert name in config.flag_of(f).help_text()


def test_synthetic_sizes_default_to_the_data_packages_count():
    from elastictrainer import data

    for name in ("num_train", "num_test"):
        assert config.shown_default(config.CONFIG_FIELDS[name]) == str(data.SYNTHETIC_EXAMPLES)
    # the loader's defaults are that same constant (read without importing TensorFlow)
    import ast
    import importlib.util

    source = open(importlib.util.find_spec("elastictrainer.data.synthetic").origin).read()
    fn = next(n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.FunctionDef) and n.name == "synthetic_dataset")
    defaults = dict(zip([a.arg for a in fn.args.args][-len(fn.args.defaults):],
                        fn.args.defaults))
    for name in ("num_train", "num_test"):
        assert isinstance(defaults[name], ast.Name) and defaults[name].id == "SYNTHETIC_EXAMPLES"


def test_sizing_a_dataset_that_does_not_exist_names_the_dataset_as_what_is_wrong(tmp_path):
    """--num_train with an unknown --dataset_name: the name is refused (with the valid ones),
    not the flag; with a TFDS name or a folder's path the flag is what is wrong."""
    from elastictrainer.errors import UserError

    with pytest.raises(UserError, match=r"^unknown dataset 'nosuch'; valid: caltech_birds2011"):
        Config(dataset_name="nosuch", num_train=64).validate()
    for name in ("oxford_iiit_pet", str(tmp_path)):
        with pytest.raises(UserError, match=r"^--num_train sizes the built-in generated"):
            Config(dataset_name=name, num_train=64).validate()


def test_the_apis_settings_are_checked_for_their_type_in_one_line():
    """Config from Python: "false" is no bool (it would read as true), "0.5" no rho."""
    from elastictrainer.errors import UserError

    with pytest.raises(UserError, match=r"^--rho_feedback is true or false, got 'false' \(str\)$"):
        Config(rho_feedback="false").validate()
    with pytest.raises(UserError, match=r"^--economy is true or false, got 1 \(int\)$"):
        Config(economy=1).validate()
    with pytest.raises(UserError, match=r"must be a number in \(0, 1\], or auto; got '0.5'$"):
        Config(rho="0.5").validate()
    Config(rho_feedback=False, economy=True, rho=0.5).validate()


def test_a_generated_run_name_is_one_word_for_the_shell():
    name = Config(model_name="my model.keras", dataset_name="user data",
                  rho=0.6).resolved_run_name()
    assert name.startswith("my_model_user_data_elastic_training_rho0.6_seed0_")
    assert " " not in name


def test_the_callbacks_own_defaults_are_declared_in_config():
    assert config.FIT_LOGDIR.startswith(Config().logdir)
    assert set(config.FIT_CONFIG_FIELDS) <= set(config.CONFIG_FIELDS)


@pytest.mark.parametrize("command", ["profile", "figure"])
def test_each_commands_documented_flag_table_is_generated_from_its_settings(command):
    settings, doc = config.DOC_TABLES[command]
    block = config.documented_flag_table(open(doc, encoding="utf-8").read(), command)
    assert block is not None, f"{doc} lost its {config.table_markers(command)[0]} block"
    assert block == config.flag_table(settings), (
        f"{doc}'s {command} flags differ from {settings.__name__}'s: run python -m "
        "elastictrainer.config --write")
