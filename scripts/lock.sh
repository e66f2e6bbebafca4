#!/usr/bin/env bash
# Regenerates requirements/lock.txt, the pinned versions that ./dev.sh and .ci/run install (as pip constraints), from
# the dependencies in pyproject.toml (every extra the tests and the deployment use). Run it after changing them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m piptools --version >/dev/null 2>&1 || "$PY" -m pip install --quiet pip-tools
CUSTOM_COMPILE_COMMAND="scripts/lock.sh" PIP_CONSTRAINT= "$PY" -m piptools compile --quiet \
  --extra dev --extra s3 --strip-extras --allow-unsafe \
  --no-emit-index-url --no-emit-trusted-host --no-emit-find-links \
  -o requirements/lock.txt pyproject.toml
# the project itself comes in through its own extras; it is installed from the work tree, not pinned
sed -i '/^overtake @ /,/^[a-z]/{/^overtake @ /d;/^    # via/d;/^    #   /d}' requirements/lock.txt
echo "scripts/lock.sh: wrote requirements/lock.txt"
