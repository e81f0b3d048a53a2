"""python -m elastictrainer.config [--write]: print the docs' flag tables, or rewrite their
blocks in docs/usage.md and docs/reproducing.md."""
import sys

from elastictrainer.config.doc_tables import main

main(sys.argv[1:])
