#!/usr/bin/env bash
# The main job, from a fresh clone with ../shared beside it:
#   1. set up .venv when missing (scripts/_env.sh);
#   2. bootstrap a dχ-privacy (nearest-token text over the compact pca32-int8 table, eta 40,
#      under the function-words token policy: bench/results/frontier.md) SST-2 classifier into $PRIVBERT_HOME (default ./var)
#      unless one is already promoted: trained on
#      ../shared/data/sst2_sentences/train.tsv with the default recipe (fresh noise each epoch,
#      channel-posterior inputs), its accuracy measured on whole held-out sentences;
#   3. start `cloud-api serve` on a free loopback port with throwaway keys;
#   4. privatize a few example sentences on the device with `edge-agent` and get
#      predictions through the API (only the privatized payloads travel);
#   5. print each sentence (it never left this machine) with its prediction, and the
#      guarantee; stop the service.
# The bootstrap shows its progress on a terminal: a line per step, and a bar with the time left
# for each long one. Extra arguments go to `cloud-api bootstrap` (e.g. --limit 20000 --epochs 2;
# --no-progress: the step lines only).
. "$(dirname "$0")/_env.sh"
ensure_venv
cd "$ROOT"

DATA="$ROOT/../shared/data/sst2_sentences"
export PRIVBERT_HOME="${PRIVBERT_HOME:-$ROOT/var}"
MODEL=sst2
[ -f "$DATA/train.tsv" ] || { echo "demo: $DATA/train.tsv not found (../shared beside the clone?)" >&2; exit 1; }

cloud-api bootstrap --data "$DATA/train.tsv" --dev "$DATA/dev.tsv" --mechanism dchi-text \
    --model-id "$MODEL" --if-missing "$@"

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# throwaway keys for this run only (a real deployment sets PRIVBERT_API_KEYS / _ADMIN_KEYS)
PRIVBERT_API_KEYS="$(python -c 'import secrets; print(secrets.token_urlsafe(24))')"
PRIVBERT_ADMIN_KEYS="$(python -c 'import secrets; print(secrets.token_urlsafe(24))')"
export PRIVBERT_API_KEYS PRIVBERT_ADMIN_KEYS
PORT="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"

echo "demo: starting cloud-api serve on $URL (log: $work/serve.log)" >&2
PRIVBERT_WORKER_IN_SERVE=0 cloud-api serve --host 127.0.0.1 --port "$PORT" >"$work/serve.log" 2>&1 &
server_pid=$!
python - "$URL" "$server_pid" <<'PY' || { echo "demo: the service did not become ready; last log lines:" >&2; tail -n 20 "$work/serve.log" >&2; exit 1; }
import os, sys, time, httpx
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    try:
        if httpx.get(url + "/readyz", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.3)
sys.exit(1)
PY

# the edge privatizes at the eta (and the token policy's public_p) the served model was trained
# for (its bundle comes with it)
PARAMS="$(python - "$URL" "$MODEL" <<'PY'
import os, sys, httpx
url, model = sys.argv[1:3]
info = httpx.get(f"{url}/v1/models", timeout=10,
                 headers={"Authorization": f"Bearer {os.environ['PRIVBERT_API_KEYS']}"}).json()
params = next(m for m in info["models"] if m["id"] == model)["params"]
print(f"--eta {params['eta']}" + (f" --public-p {params['public_p']}" if "public_p" in params else ""))
PY
)" || { echo "demo: the service does not list model $MODEL" >&2; exit 1; }

cat > "$work/examples.txt" <<'TXT'
a gripping, beautifully acted story that stays with you
the plot is dull and the jokes fall flat
one of the most charming films of the year
i wanted my two hours back
a tender and funny portrait of a family
TXT

echo "demo: privatizing $(wc -l < "$work/examples.txt") sentences on this device (dchi-text $PARAMS) and asking the service" >&2
# the demo's own privacy budget ledger: these example sentences are not the user's texts
PRIVBERT_API_KEY="$PRIVBERT_API_KEYS" edge-agent privatize "$work/examples.txt" \
    --mechanism dchi-text $PARAMS --server "$URL" --model "$MODEL" --post predict \
    --no-progress -o "$work/predictions.jsonl" --ledger "$work/ledger.sqlite3"

python - "$URL" "$MODEL" "$work/examples.txt" "$work/predictions.jsonl" <<'PY'
import json, os, sys, httpx
from shared.accounting import summary
url, model, texts, preds = sys.argv[1:5]
info = httpx.get(f"{url}/v1/models", timeout=10,
                 headers={"Authorization": f"Bearer {os.environ['PRIVBERT_API_KEYS']}"}).json()
m = next(x for x in info["models"] if x["id"] == model)
dev = m["metrics"]
acc = dev.get("fresh_accuracy", dev.get("accuracy", float("nan")))
how = (f"mean of {len(dev['fresh_draws'])} fresh privatizations" if "fresh_draws" in dev
       else "the privatization the epoch was chosen on")
print(f"\nmodel {model} {m['version']}: {m['mechanism']} {json.dumps(m['params'])}, "
      f"accuracy {acc:.3f} on {dev.get('n', '?')} held-out whole sentences "
      f"(sst2_sentences/dev.tsv, {how})")
print(f"guarantee: {summary(m['guarantee'])}")
print("(the sentences below never left this machine; the service saw only privatized token ids)\n")
names = {"0": "negative", "1": "positive"}  # SST-2 labels (../shared/data/README.md)
lines = open(texts).read().splitlines()
for row in open(preds):
    pred = json.loads(row)
    label = pred.get("label")
    score = (pred.get("scores") or {}).get(str(label), float("nan"))
    print(f"  {names.get(str(label), label)!s:>8} {score:.2f}  {lines[pred['line'] - 1]}")
PY
echo
echo "what this device has sent, composed (edge-agent budget):"
edge-agent budget --ledger "$work/ledger.sqlite3"
