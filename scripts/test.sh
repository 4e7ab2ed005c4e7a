#!/usr/bin/env bash
# The whole test suite: lint, then every test on SQLite and on PostgreSQL (127.0.0.1:5432,
# started if it is down) in a throwaway database dropped afterwards. Extra arguments go to
# pytest. PostgreSQL being unreachable is a failure, never a skip.
#
# scripts/test.sh --fast [ARGS]: the same lint, then the tests that need no service and take
# no time, in under a minute on 2 cores: every test but those tests/conftest.py marks as
# needing PostgreSQL, a live server or processes of their own, llama.cpp, a browser or a
# fresh install, or as slow (and the `alone` ones). No PostgreSQL (the variable that names
# it unset), no Chromium. A marker expression of the caller's narrows the fast tier
# (`--fast -m EXPR` runs `(EXPR) and <the fast tier>`), its workers as many as usual.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
# Bytecode cached, whatever the environment says: the suite starts hundreds of Python
# processes (CLIs, registries, agents), each of which would compile fleetbench again, and
# pytest would rewrite every test module's asserts in each of its processes.
unset PYTHONDONTWRITEBYTECODE

lint() {
    ruff check .
    ruff format --check .
    # mypy's cache beside pip's, not in the checkout: a fresh clone checks only what changed
    # (mypy compares the files' hashes), 30 s -> 1 s here
    MYPY_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fleetbench/mypy" mypy
}
# pytest-xdist workers, each taking whole test files: one more than the cores (at most 4),
# as the suite waits on servers, subprocesses and the database as much as it computes
# (FLEETBENCH_TEST_WORKERS=1: one process).
cores="$(nproc)"
WORKERS="${FLEETBENCH_TEST_WORKERS:-$(( cores > 1 ? (cores < 4 ? cores + 1 : 4) : 1 ))}"

# Every marker pyproject.toml declares is a tier to leave out (tests/test_tiers.py checks)
FAST_MARKS="not (postgres or server or engine or browser or install or slow or alone)"
if [ "${1:-}" = --fast ]; then
    shift
    unset FLEETBENCH_TEST_POSTGRES_URL
    lint
    marks="$FAST_MARKS"
    passed=()
    while [ $# -gt 0 ]; do
        case "$1" in
            -m) marks="(${2:?-m needs a marker expression}) and ($FAST_MARKS)"; shift 2 ;;
            -m*) marks="(${1#-m}) and ($FAST_MARKS)"; shift ;;
            *) passed+=("$1"); shift ;;
        esac
    done
    workers=()
    [ "$WORKERS" = 1 ] || workers=(-n "$WORKERS" --dist loadfile)
    exec python -m pytest ${workers[@]+"${workers[@]}"} -m "$marks" ${passed[@]+"${passed[@]}"}
fi

PG_ADMIN_URL="${FLEETBENCH_TEST_POSTGRES_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
pg_up() { python -c "import psycopg; psycopg.connect('$PG_ADMIN_URL', connect_timeout=3).close()" 2>/dev/null; }
if ! pg_up; then
    echo "PostgreSQL is not answering on 127.0.0.1:5432; starting it" >&2
    for version in $(ls /etc/postgresql); do
        pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    done
    for _ in $(seq 30); do pg_up && break; sleep 1; done
    pg_up || { echo "PostgreSQL could not be reached at $PG_ADMIN_URL" >&2; exit 1; }
fi

DB="fleetbench_test_$$"
pg_admin() {
    python -c "import psycopg, sys; c = psycopg.connect('$PG_ADMIN_URL', autocommit=True); c.execute(sys.argv[1]); c.close()" "$1"
}
pg_admin "CREATE DATABASE $DB"
trap 'pg_admin "DROP DATABASE IF EXISTS $DB WITH (FORCE)"' EXIT
export FLEETBENCH_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:5432/$DB"

# The dashboard's browser tests drive Debian's Chromium (Playwright downloads no browser).
if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's chromium for the dashboard tests" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
fi

lint
# Tests marked `alone` compare speeds measured at different moments, which the other
# workers' load would move: they run afterwards, alone.
for argument in "$@"; do
    # A marker expression of the caller's own replaces ours (pytest keeps the last -m): one run.
    case "$argument" in -m*) WORKERS=1 ;; esac
done
if [ "$WORKERS" = 1 ]; then
    python -m pytest "$@"
    exit
fi
others=0
python -m pytest -n "$WORKERS" --dist loadfile -m "not alone" "$@" || others=$?
[ "$others" = 2 ] && exit 2  # interrupted (Ctrl-C): not on to the second run
alone=0
python -m pytest -m alone "$@" || alone=$?
# 5: no test of that kind among those asked for, which is fine unless it holds for both
if [ "$others" = 5 ] && [ "$alone" = 5 ]; then
    exit 5
fi
[ "$others" = 5 ] && others=0
[ "$alone" = 5 ] && alone=0
exit $(( others != 0 ? others : alone ))
