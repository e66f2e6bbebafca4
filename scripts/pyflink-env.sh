#!/usr/bin/env bash
# Makes PyFlink's own environment for the benchmarks' side-by-side runs (overtake bench batches): .overtake/pyflink,
# with the versions pinned in requirements/pyflink.txt (apache-flink 2.3 pins pyarrow, pandas and numpy below the
# project's, so it cannot share the project's environment). PyFlink needs Java 11 or newer on PATH, as Spark does.
# Prints the environment's Python; OVERTAKE_PYFLINK_PYTHON may name another one instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=.overtake/pyflink
PY=${PYTHON:-python3}
stamp=$(sha256sum requirements/pyflink.txt | cut -d' ' -f1)
if [ "$(cat "$ENV/.installed" 2>/dev/null)" != "$stamp" ]; then
  echo "scripts/pyflink-env.sh: installing PyFlink into $ENV" >&2
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  "$ENV/bin/python" -m pip install --quiet -r requirements/pyflink.txt >&2
  echo "$stamp" > "$ENV/.installed"
fi
echo "$PWD/$ENV/bin/python"
