"""Every command's settings, each a frozen object whose fields carry their command-line flags,
so that the parsers and the docs' flag tables are generated from one declaration.  No
TensorFlow: the CLI builds and checks the settings before starting TensorFlow.

    flags.py       argparse types, the one-line-error parser, a field's Flag metadata
    settings.py    Config: the train command's settings (saved with a run as config.json),
                   and ElasticCallback's defaults
    commands.py    ProfileConfig and FigureConfig: the profile and figure commands' settings
    doc_tables.py  the docs' flag tables (`python -m elastictrainer.config [--write]`)

The names callers use are importable from here: `from elastictrainer.config import Config`.
"""
from elastictrainer.config.flags import (ArgumentParser, DefaultsHelpFormatter, Flag,
                                         check_positive, comma_list, flag, flag_of, option_of,
                                         parse_auto_bool, shown_default, str2bool)
from elastictrainer.config.settings import (CONFIG_FIELDS, FIT_CONFIG_FIELDS, FIT_LOGDIR, Config,
                                            as_keywords)
from elastictrainer.config.commands import (FigureConfig, ProfileConfig, parse_resources,
                                            same_as)
from elastictrainer.config.doc_tables import (DOC_TABLES, DOCS, TABLE_BEGIN, TABLE_END,
                                              USAGE_DOC, documented_flag_table, flag_table,
                                              table_markers, write_flag_table)

__all__ = [
    "ArgumentParser", "DefaultsHelpFormatter", "Flag", "check_positive", "comma_list", "flag",
    "flag_of", "option_of", "parse_auto_bool", "shown_default", "str2bool",
    "CONFIG_FIELDS", "FIT_CONFIG_FIELDS", "FIT_LOGDIR", "Config", "as_keywords",
    "FigureConfig", "ProfileConfig", "parse_resources", "same_as",
    "DOC_TABLES", "DOCS", "TABLE_BEGIN", "TABLE_END", "USAGE_DOC", "documented_flag_table",
    "flag_table", "table_markers", "write_flag_table",
]
