#!/usr/bin/env bash
# Overtake's one entry point on a fresh machine. It sets itself up (virtualenv, dependencies, Java check).
#   ./dev.sh demo   run the demo pipeline on local Spark with the coordinator on its embedded defaults; its UI's
#                   address is printed at once, and in a terminal it keeps serving the UI after the run (Ctrl-C)
#   ./dev.sh test   run the test suite (extra arguments go to pytest)
#   ./dev.sh serve  run the coordinator on its embedded defaults (prints http://127.0.0.1:8321/ when ready);
#                   --data-dir .overtake/demo serves what the demo left
#   ./dev.sh bench  run the benchmarks (extra arguments go to `overtake bench`)
#   ./dev.sh <any overtake command...>
# Dependencies are installed at the versions pinned in requirements/lock.txt (scripts/lock.sh regenerates it).
set -euo pipefail
cd "$(dirname "$0")"

VENV=${OVERTAKE_VENV:-.venv}
PY="$VENV/bin/python"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_python() {
  local base
  base=$(command -v python3 || true)
  if [ -z "$base" ]; then
    echo "Python 3.10 or newer is needed: install python3 (with venv and pip) and run this again." >&2
    exit 1
  fi
  if ! "$base" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    echo "Python 3.10 or newer is needed; $base is $("$base" --version 2>&1)." >&2
    exit 1
  fi
  if [ ! -x "$PY" ]; then
    say "creating the virtualenv in $VENV"
    "$base" -m venv "$VENV" || { echo "could not create a virtualenv: install python3-venv" >&2; exit 1; }
  fi
  # Reinstall only when the project's dependency list or the pinned versions changed.
  local stamp="$VENV/.overtake-installed" want
  want=$(cat pyproject.toml requirements/lock.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing Overtake and its dependencies at the versions of requirements/lock.txt"
    say "(the first run downloads about 500 MB, PySpark is most of it: a few minutes; pip's progress follows)"
    "$PY" -m pip install --quiet --upgrade pip
    if ! "$PY" -m pip install --progress-bar on -c requirements/lock.txt -e '.[dev]'; then
      echo "installing the pinned versions failed (see above); trying the newest versions pyproject.toml allows" >&2
      "$PY" -m pip install --progress-bar on -e '.[dev]'
    fi
    echo "$want" > "$stamp"
    say "installed"
  fi
}

java_major() {
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

require_java() {
  local major
  major=$(java_major)
  if [ "${major:-0}" -lt 17 ]; then
    echo "PySpark needs Java 17 or newer, and $( [ "${major:-0}" = 0 ] && echo 'no java was found' || echo "java is version $major" )." >&2
    echo "Install a JDK or JRE 17+ (for example the openjdk-17-jre-headless package) and run this again." >&2
    exit 1
  fi
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo)
    require_java
    ensure_python
    exec "$VENV/bin/overtake" demo "$@"
    ;;
  test)
    ensure_python
    if [ "$(java_major)" -lt 17 ]; then
      echo "warning: Java 17+ not found: the Spark tests will be skipped (they fail under CI)." >&2
      export OVERTAKE_NO_JAVA=1
    fi
    # The report's summary is printed after pytest exits: the failures stay the last lines of the log even when a
    # library writes to stderr while the interpreter shuts down
    report=${OVERTAKE_TEST_REPORT:-.overtake/test-report.xml}
    mkdir -p "$(dirname "$report")"
    # The suite runs on several workers (pytest-xdist), each with its own SparkSession and services: most of its
    # time is Spark tests waiting for kills, restarts and paced sources, and two workers take about two thirds of
    # one's time even on 2 cores. OVERTAKE_TEST_WORKERS sets how many (0: one process, as for a single test); a -n
    # or -p no:xdist of your own wins.
    workers=()
    if ! printf '%s\n' "$@" | grep -qE '^(-n|--numprocesses|no:xdist|-pno:xdist)'; then
      n=${OVERTAKE_TEST_WORKERS:-}
      if [ -z "$n" ]; then  # by default one per core, at most 4
        n=$(nproc 2>/dev/null || echo 1)
        [ "$n" -gt 4 ] && n=4
      fi
      case "$n" in ''|*[!0-9]*) echo "OVERTAKE_TEST_WORKERS must be a number of workers, not '$n'" >&2; exit 2 ;; esac
      [ "$n" -lt 2 ] && n=0
      workers=(-n "$n" --dist loadfile)
    fi
    rc=0
    "$PY" -m pytest --junitxml="$report" "${workers[@]}" "$@" || rc=$?
    "$PY" scripts/test_summary.py "$report" || true
    exit "$rc"
    ;;
  serve)
    ensure_python
    exec "$VENV/bin/overtake" serve "$@"
    ;;
  bench)
    require_java
    ensure_python
    exec "$VENV/bin/overtake" bench "$@"
    ;;
  help|-h|--help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  *)
    ensure_python
    exec "$VENV/bin/overtake" "$cmd" "$@"
    ;;
esac
