#!/usr/bin/env bash
# The privacy explorer, from a fresh clone with ../shared beside it: build the page
# (scripts/build_web.sh), bootstrap the demo's SST-2 model into $PRIVBERT_HOME (default ./var)
# unless one is promoted there, and serve it with /demo enabled on a loopback port until
# Ctrl-C. The page gets a throwaway application key of this run only, capped at
# PRIVBERT_DEFAULT_BUDGET (never a production key: anyone who opens /demo can read it).
# It prints that key and the origins allowed to use it (PRIVBERT_CORS_ORIGINS, default the
# Vite dev server's), so that a developer's own page can try @privbert/edge against it.
# The bootstrap shows its progress on a terminal: a line per step, and a bar with the time left
# for each long one (privatizing the training text, fine-tuning, the dev set's fresh draws).
# Extra arguments go to `cloud-api bootstrap` (--no-progress: the step lines only).
. "$(dirname "$0")/_env.sh"
ensure_venv
ensure_web_edge
ensure_web_demo
cd "$ROOT"

DATA="$ROOT/../shared/data/sst2_sentences"
export PRIVBERT_HOME="${PRIVBERT_HOME:-$ROOT/var}"
[ -f "$DATA/train.tsv" ] || { echo "web_demo: $DATA/train.tsv not found (../shared beside the clone?)" >&2; exit 1; }
cloud-api bootstrap --data "$DATA/train.tsv" --dev "$DATA/dev.tsv" --mechanism dchi-text \
    --model-id sst2 --label-names 0=negative,1=positive --if-missing "$@"

key() { python -c 'import secrets; print(secrets.token_urlsafe(24))'; }
PRIVBERT_API_KEYS="$(key)" PRIVBERT_ADMIN_KEYS="$(key)" PRIVBERT_DEMO_KEY="demo-$(key)"
export PRIVBERT_API_KEYS PRIVBERT_ADMIN_KEYS PRIVBERT_DEMO_KEY PRIVBERT_DEMO=1
export PRIVBERT_DEFAULT_BUDGET="${PRIVBERT_DEFAULT_BUDGET:-1000000}" PRIVBERT_WORKER_IN_SERVE=0
# a developer's own page on the Vite dev server may call /v1 (CORS)
export PRIVBERT_CORS_ORIGINS="${PRIVBERT_CORS_ORIGINS:-http://localhost:5173,http://127.0.0.1:5173}"
PORT="${PRIVBERT_PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
cat >&2 <<EOF
web_demo: open http://127.0.0.1:$PORT/demo/ (Ctrl-C stops the service)
web_demo: your own page can use this run's throwaway application key (gone when this stops;
  capped at a privacy budget of $PRIVBERT_DEFAULT_BUDGET; never put a production key in a page):
    EdgeSession.open({ server: "http://127.0.0.1:$PORT", apiKey: "$PRIVBERT_DEMO_KEY" })
  pages from these origins may call it: $PRIVBERT_CORS_ORIGINS (PRIVBERT_CORS_ORIGINS=... to change);
  the page reads it at http://127.0.0.1:$PORT/demo/config.json too. In production, keep the key on
  your backend: web_edge/examples/forwarder.mjs (docs/web.md, "Keeping the API key off the page").
EOF
exec cloud-api serve --host 127.0.0.1 --port "$PORT"
