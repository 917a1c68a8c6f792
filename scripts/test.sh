#!/usr/bin/env bash
# The tests, from a fresh clone: set up .venv and PostgreSQL when missing, then run
# README's test command. Extra arguments go to pytest.
. "$(dirname "$0")/_env.sh"
ensure_postgres
ensure_venv
cd "$ROOT"
set +e
python -m pytest -m "not slow" -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "tests: pytest collected no tests (exit code 5); that is a failure here" >&2
    exit 1
fi
exit "$rc"
