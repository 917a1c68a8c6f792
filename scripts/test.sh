#!/usr/bin/env bash
# The tests, from a fresh clone: set up .venv, PostgreSQL and Chromium when missing, install
# and build the web edge and its page (npm ci, npm run build), then run
# README's test command. Extra arguments go to pytest.
. "$(dirname "$0")/_env.sh"
ensure_postgres
ensure_chromium
ensure_venv
ensure_web
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
