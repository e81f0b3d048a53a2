#!/usr/bin/env bash
# Shared by every run_figure*.sh: pick the project's Python and call the one driver,
# `elastictrainer figure` (elastictrainer/experiments/figures.py).  SMOKE=1 (any value but 0)
# adds --smoke, OFFLINE=1 --offline (both: the driver refuses in one line).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
protocol=()
if [ -n "${SMOKE:-}" ] && [ "${SMOKE}" != 0 ]; then protocol+=(--smoke); fi
if [ -n "${OFFLINE:-}" ] && [ "${OFFLINE}" != 0 ]; then protocol+=(--offline); fi
# the clone's package, whether or not it was pip-installed into that Python
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m elastictrainer figure "$@" "${protocol[@]}"
