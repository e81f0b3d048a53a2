"""Config is the one declaration of the train command's settings: its fields make the flags,
their defaults and help, and docs/usage.md's flag table."""
import dataclasses
import subprocess
import sys

import pytest

from elastictrainer import cli, config
from elastictrainer.config import Config

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
    assert tuple(actions["optimizer"].choices) == tuple(config.OPTIMIZERS)
    assert tuple(actions["lr_schedule"].choices) == tuple(config.LR_SCHEDULES)
    assert tuple(actions["energy"].choices) == tuple(MODES)


@pytest.mark.parametrize("argv,needle", [
    (["--rho", "half"], "--rho"),
    (["--optimizer", "lamb"], "--optimizer"),
    (["--resume", "maybe"], "--resume"),
    (["--quiet", "yes"], "unrecognized"),
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
