#!/usr/bin/env bash
# The tests, from a fresh clone: set up .venv, PostgreSQL, Chromium, the web edge's
# node_modules and the privacy explorer page (web_edge/demo) when missing, then run the
# checks (ruff on the repository, mypy on every package (strict on shared/), the generated files of
# the mechanism spec, tsc (strict, noUncheckedIndexedAccess) on the web edge and its demo
# page, ESLint on the web edge's TypeScript and JavaScript), README's test command and the
# web edge's JS tests (all must pass).
# Extra arguments go to pytest.
. "$(dirname "$0")/_env.sh"
# the web edge's npm packages and builds need nothing of Python's: set them up beside the
# Debian packages and the venv (a fresh clone spends minutes in each)
(ensure_web_edge; ensure_web_demo) &
web_setup=$!
ensure_postgres
ensure_chromium
ensure_venv
wait "$web_setup" || { echo "tests: setting up the web edge failed (see above)" >&2; exit 1; }
cd "$ROOT"
set +e
checks_rc=0
ruff check . || { echo "tests: ruff found problems (ruff check .)" >&2; checks_rc=1; }
mypy || { echo "tests: the type check failed (mypy: every package, shared/ strict)" >&2; checks_rc=1; }
python -m shared.spec --check || checks_rc=1
(cd web_edge && npm run --silent typecheck) \
    || { echo "tests: tsc found type errors in the web edge (cd web_edge && npm run typecheck)" >&2; checks_rc=1; }
(cd web_edge/demo && npx --no-install tsc --noEmit) \
    || { echo "tests: tsc found type errors in the demo page (cd web_edge/demo && npx tsc --noEmit)" >&2; checks_rc=1; }
(cd web_edge && npm run --silent lint) \
    || { echo "tests: ESLint found problems in the web edge (cd web_edge && npm run lint)" >&2; checks_rc=1; }
(cd web_edge && npm test --silent)
js_rc=$?
python -m pytest -m "not slow" -n auto --dist loadfile -q --durations=25 "$@"
rc=$?
set -e
if [ "$checks_rc" -ne 0 ]; then
    exit 1
fi
if [ "$js_rc" -ne 0 ]; then
    echo "tests: the web edge's JS tests failed (cd web_edge && npm test)" >&2
    exit 1
fi
if [ "$rc" -eq 5 ]; then
    echo "tests: pytest collected no tests (exit code 5); that is a failure here" >&2
    exit 1
fi
exit "$rc"
