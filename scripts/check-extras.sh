#!/usr/bin/env bash
# Every extra of pyproject.toml resolves without the lock file: `pip install 'overtake[EXTRA]'` in a fresh
# environment must find versions that fit together (the lock only makes the tests repeatable). Resolution only
# (`pip install --dry-run`), nothing is installed. Usage: scripts/check-extras.sh [python [extra ...]]
# (no extras named: the bare package and every extra but those in $SKIP_EXTRAS)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${OVERTAKE_VENV:-.venv}/bin/python}
[ $# -gt 0 ] && shift
if [ $# -gt 0 ]; then
  extras="$*"; targets=("$@")
else
  extras=$("$PY" - <<'PYEOF'
try:
    import tomllib
except ImportError:  # Python 3.10: the parser pip carries
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["project"]["optional-dependencies"]))
PYEOF
)
  targets=("")
  for e in $extras; do
    case " ${SKIP_EXTRAS:-} " in *" $e "*) ;; *) targets+=("$e") ;; esac
  done
fi
failed=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for extra in "${targets[@]}"; do
  spec=".${extra:+[$extra]}"
  if "$PY" -m pip install --dry-run --ignore-installed --quiet --no-input "$spec" >"$log" 2>&1; then
    echo "resolves without the lock: overtake${extra:+[$extra]}"
  else
    echo "does NOT resolve without the lock: overtake${extra:+[$extra]}" >&2
    grep -v '^WARNING' "$log" | tail -15 >&2
    failed+=("${extra:-(none)}")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "extras that do not resolve without requirements/lock.txt: ${failed[*]}" >&2
  exit 1
fi
