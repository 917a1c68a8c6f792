#!/usr/bin/env bash
# The web edge and the privacy explorer page, from a fresh clone: npm ci (from the lock files)
# and npm run build in web_edge and web_edge/demo. The page lands in web_edge/demo/dist,
# which `PRIVBERT_DEMO=1 cloud-api serve` serves at /demo.
. "$(dirname "$0")/_env.sh"
ensure_web_edge
ensure_web_demo
[ -f "$ROOT/web_edge/demo/dist/index.html" ] || { echo "build_web: web_edge/demo/dist/index.html was not built" >&2; exit 1; }
echo "built $ROOT/web_edge/demo/dist" >&2
