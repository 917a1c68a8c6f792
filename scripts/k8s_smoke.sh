#!/usr/bin/env bash
# deploy/k8s end to end on this machine (docs/deployment.md, "Kubernetes"; not part of
# .ci/run: the image build is long):
#
#   scripts/k8s_smoke.sh        = scripts/image.sh k8s: build both images, then:
#
#  1. every object of every overlay valid against the Kubernetes schema (deploy/k8s/manifests.py
#     validate, kubernetes-validate strict);
#  2. overlays/trial rendered by kubectl's kustomize and run with `podman kube play` (the
#     podman form of manifests.py: host network, loopback ports only): PostgreSQL, then two
#     serve pods and the worker, each serve pod with its own emptyDir home (no shared volume);
#     a tiny model bootstrapped by a train container into the database's model store;
#  3. predictions and records through both serve pods;
#  4. POST /admin/retrain: the worker pod trains, stores and promotes; both serve pods serve
#     the new version within 10 s of the job's end;
#  5. serve pod 1 killed mid-traffic: pod 0 keeps answering, records retried with their
#     Idempotency-Key on pod 0; every accepted record in the database once, no other;
#  6. one key's rate limit over both pods: admitted <= burst + rate x elapsed;
#  7. one key's budget spent through both pods at once: never over its cap, charged exactly;
#  8. no key, password or sentence word in any pod's log; everything removed; `k8s smoke: ok`.
#
# Sourced by scripts/image.sh (ENGINE, LOGS, ROOT, STEP, fail, say, CLEANUP, and
# scripts/image_smoke.sh's helpers); run directly, it runs `scripts/image.sh k8s`.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    exec "$(cd "$(dirname "$0")" && pwd)/image.sh" k8s "$@"
fi

K8S_READY_TIMEOUT="${PRIVBERT_SMOKE_READY_TIMEOUT:-600}"
K8S_JOB_TIMEOUT="${PRIVBERT_SMOKE_JOB_TIMEOUT:-1200}"
# low, so that the rate check exceeds it even on a busy machine (every phase's client
# waits out a 429 as a client should)
K8S_RATE=1
K8S_BURST=10

k8s_b64() { printf '%s' "$1" | base64 -w0; }

k8s_secret() {  # k8s_secret NAME KEY=VALUE...: a podman secret as kube play reads it
    local name="$1" json="{" sep="" pair
    shift
    for pair in "$@"; do
        json+="$sep\"${pair%%=*}\": \"$(k8s_b64 "${pair#*=}")\""
        sep=", "
    done
    podman secret rm "$name" >/dev/null 2>&1 || true
    printf '%s}' "$json" | podman secret create "$name" - >/dev/null \
        || fail "podman secret create $name"
    CLEANUP=("podman secret rm $name" "${CLEANUP[@]}")
}

k8s_ready() { [ "$(curl_code "$1/readyz")" = 200 ]; }

curl_code() {
    "$SPY" -c 'import sys, httpx
try:
    print(httpx.get(sys.argv[1], timeout=5).status_code)
except httpx.HTTPError:
    print(0)' "$1"
}

k8s_admin() {  # k8s_admin METHOD URL [JSON]: "STATUS BODY" with the admin key
    "$SPY" - "$@" <<'EOF'
import os, sys, httpx
method, url = sys.argv[1:3]
body = sys.argv[3] if len(sys.argv) > 3 else None
r = httpx.request(method, url, content=body, timeout=30, headers={
    "Authorization": "Bearer " + os.environ["SMOKE_ADMIN"], "Content-Type": "application/json"})
print(r.status_code, r.text)
EOF
}

k8s_down() {  # logs into $LOGS, then every pod, volume and claim of the smoke removed
    local c
    for c in $(podman ps -a --format '{{.Names}}' | grep -E '^privbert-(serve-[01]|worker|postgres)-pod' || true); do
        podman logs "$c" >"$LOGS/k8s-$c.log" 2>&1 || true
    done
    [ -z "${KUBE:-}" ] || {
        podman kube down "$KUBE/privbert.yaml" >/dev/null 2>&1 || true
        podman kube down "$KUBE/postgres.yaml" >/dev/null 2>&1 || true
    }
    for c in $(podman pod ps --format '{{.Name}}' | grep -E '^privbert-(serve-[01]|worker|postgres)-pod' || true); do
        podman pod rm -f -t 5 "$c" >/dev/null 2>&1 || true  # one kube down left behind
    done
    podman volume rm -f privbert-serve-0-home privbert-serve-0-tmp privbert-serve-1-home \
        privbert-serve-1-tmp privbert-worker-tmp privbert-worker-home data-privbert-postgres-0 \
        privbert-postgres-run privbert-postgres-tmp >/dev/null 2>&1 || true
}

k8s_smoke() {
    local t0 pg s0 s1 u0 u1 body job version since
    t0=$(date +%s)
    SMOKE_T0=$t0
    [ "$ENGINE" = buildah ] || fail "the k8s smoke runs pods with podman (PRIVBERT_ENGINE=buildah)"
    smoke_python
    STEP="k8s (validate)"
    "$SPY" -c 'import kubernetes_validate' 2>/dev/null \
        || fail "$SPY has no kubernetes_validate: pip install -r deploy/k8s/requirements.txt"
    command -v kubectl >/dev/null || fail "kubectl (its kustomize renders deploy/k8s) is not installed"
    "$SPY" "$ROOT/deploy/k8s/manifests.py" validate >"$LOGS/k8s-validate.log" 2>&1 \
        || fail "manifests not valid: $LOGS/k8s-validate.log"
    say "$(tail -n1 "$LOGS/k8s-validate.log") ($(grep -c ': ok ' "$LOGS/k8s-validate.log") objects in $(ls -d "$ROOT"/deploy/k8s/overlays/*/ | wc -l) overlays)"

    WORK="$(mktemp -d -t privbert-k8s.XXXXXX)"  # under $TMPDIR (default /tmp)
    chmod 755 "$WORK"
    CLEANUP+=("rm -rf '$WORK'")
    smoke_inputs
    postgres_image
    SMOKE_APP="app-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    SMOKE_RATE_KEY="app-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    SMOKE_BUDGET_KEY="app-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    SMOKE_ADMIN="adm-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    PG_PASSWORD="pg-$("$SPY" -c 'import secrets; print(secrets.token_hex(12))')"
    export SMOKE_APP SMOKE_RATE_KEY SMOKE_BUDGET_KEY SMOKE_ADMIN
    pg="$(free_port)"; s0="$(free_port)"; s1="$(free_port)"
    u0="http://127.0.0.1:$s0"; u1="http://127.0.0.1:$s1"
    local db_url="postgresql+psycopg://privbert:$PG_PASSWORD@127.0.0.1:$pg/privbert"

    STEP="k8s (podman form)"
    KUBE="$WORK/kube"
    "$SPY" "$ROOT/deploy/k8s/manifests.py" podman "$ROOT/deploy/k8s/overlays/trial" \
        --out "$KUBE" --serve-ports "$s0,$s1" --pg-port "$pg" \
        --postgres-image "$PRIVBERT_POSTGRES_IMAGE" \
        --set "PRIVBERT_RATE_LIMIT_PER_KEY=$K8S_RATE" --set "PRIVBERT_RATE_LIMIT_BURST=$K8S_BURST" \
        >"$LOGS/k8s-podman-form.log" 2>&1 || fail "see $LOGS/k8s-podman-form.log"
    say "podman form of overlays/trial: $(cat "$LOGS/k8s-podman-form.log")"
    k8s_secret privbert-postgres "POSTGRES_PASSWORD=$PG_PASSWORD"
    k8s_secret privbert-secrets "PRIVBERT_API_KEYS=$SMOKE_APP,$SMOKE_RATE_KEY,$SMOKE_BUDGET_KEY" \
        "PRIVBERT_ADMIN_KEYS=$SMOKE_ADMIN" "PRIVBERT_DATABASE_URL=$db_url"
    CLEANUP=("k8s_down" "${CLEANUP[@]}")

    STEP="k8s (PostgreSQL pod)"
    podman kube play "$KUBE/postgres.yaml" >"$LOGS/k8s-play.log" 2>&1 || fail "see $LOGS/k8s-play.log"
    wait_for "$K8S_READY_TIMEOUT" "PostgreSQL ready" podman exec privbert-postgres-pod-0-postgres \
        pg_isready -q -h 127.0.0.1 -p "$pg"
    say "PostgreSQL pod ready on 127.0.0.1:$pg ($(since))"

    STEP="k8s (bootstrap into the model store)"
    # shellcheck disable=SC2016
    podman run --rm --network host -v "$WORK/in:/in:ro" \
        -e PRIVBERT_DATABASE_URL="$db_url" -e PRIVBERT_MODEL_STORE=database \
        -e PRIVBERT_MIN_RECORDS_PER_LABEL=8 \
        "$TRAIN_IMAGE" sh -c 'set -e
            cloud-api db upgrade
            mkdir -p "$PRIVBERT_HOME/bases" && cp -r /in/tiny-bert "$PRIVBERT_HOME/bases/tiny"
            cloud-api bootstrap --data /in/train.tsv --dev /in/dev.tsv --mechanism dchi-text \
                --eta 5 --base "$PRIVBERT_HOME/bases/tiny" --model-id smoke --limit 0 --epochs 1 \
                --device cpu --no-progress
            cloud-api store import-home
            cloud-api store import-home
            cloud-api store list' >"$LOGS/k8s-bootstrap.log" 2>&1 \
        || fail "see $LOGS/k8s-bootstrap.log"
    grep -q "model=smoke version=v1 promoted" "$LOGS/k8s-bootstrap.log" \
        || fail "no promoted v1 (see $LOGS/k8s-bootstrap.log)"
    grep -q "base tiny: imported" "$LOGS/k8s-bootstrap.log" \
        && grep -q "base tiny: already in the store" "$LOGS/k8s-bootstrap.log" \
        || fail "the base was not imported once (see $LOGS/k8s-bootstrap.log)"
    say "bootstrap in a train container: smoke v1 stored and promoted in PostgreSQL: $(grep -m1 '^  \* v1' "$LOGS/k8s-bootstrap.log" | tr -s ' '); its base by \`cloud-api store import-home\`, run twice: $(grep -c 'already in the store' "$LOGS/k8s-bootstrap.log") already in the store the second time ($(since))"

    STEP="k8s (serve pods and worker)"
    podman kube play "$KUBE/privbert.yaml" >>"$LOGS/k8s-play.log" 2>&1 || fail "see $LOGS/k8s-play.log"
    wait_for "$K8S_READY_TIMEOUT" "serve pod 0 /readyz 200" k8s_ready "$u0"
    wait_for "$K8S_READY_TIMEOUT" "serve pod 1 /readyz 200" k8s_ready "$u1"
    local uid m0 m1
    for c in privbert-serve-0-pod-0-serve privbert-serve-1-pod-0-serve privbert-worker-pod-0-worker; do
        uid="$(podman exec "$c" id -u):$(podman exec "$c" id -g)"
        [ "$uid" = "10001:10001" ] || fail "$c runs as $uid, not 10001:10001"
    done
    m0="$(podman volume inspect -f '{{.Mountpoint}}' privbert-serve-0-home)"
    m1="$(podman volume inspect -f '{{.Mountpoint}}' privbert-serve-1-home)"
    [ "$m0" != "$m1" ] || fail "the serve pods share a home volume"
    for m in "$m0" "$m1"; do
        [ -f "$m/models/smoke/versions/v1/manifest.json" ] || fail "$m has no fetched v1"
    done
    say "2 serve pods ready on 127.0.0.1:$s0 and :$s1, each with its own home volume holding smoke v1 fetched from the database; worker up; all run as 10001:10001 ($(since))"

    STEP="k8s (traffic through both pods)"
    local edge_out="$WORK/edge" trusted
    mkdir -p "$edge_out"
    # the edge trusts the smoke's tiny bundle (a test table the text floor refuses, as it should)
    trusted="$(k8s_admin GET "$u0/v1/models" | json_field '[m["bundle_id"] for m in d["models"] if m["id"] == "smoke"][0]')"
    [ -n "$trusted" ] || fail "GET /v1/models names no bundle for smoke"
    export PRIVBERT_TRUSTED_BUNDLES="$trusted"
    PRIVBERT_API_KEY="$SMOKE_APP" PRIVBERT_CACHE="$WORK/edge-cache" PYTHONPATH="$ROOT" \
        "$SPY" -m edge_agent.cli privatize "$WORK/in/records.tsv" --tsv --mechanism dchi-text \
        --eta 5 --server "$u0" --model smoke --no-progress >"$edge_out/records.jsonl" \
        2>"$LOGS/k8s-edge.log" || fail "see $LOGS/k8s-edge.log"
    PRIVBERT_API_KEY="$SMOKE_APP" PRIVBERT_CACHE="$WORK/edge-cache" PYTHONPATH="$ROOT" \
        "$SPY" -m edge_agent.cli privatize "$WORK/in/predict.txt" --mechanism dchi-text \
        --eta 5 --server "$u1" --model smoke --no-progress >"$edge_out/predict.jsonl" \
        2>>"$LOGS/k8s-edge.log" || fail "see $LOGS/k8s-edge.log"
    client() { PYTHONPATH="$ROOT" "$SPY" "$ROOT/scripts/k8s_smoke_client.py" "$@"; }
    client traffic "$u0" "$u1" --records "$edge_out/records.jsonl" \
        --predict "$edge_out/predict.jsonl" | tee -a "$LOGS/k8s-findings.log" >&2 \
        || fail "traffic (see above)"

    STEP="k8s (retrain and promotion)"
    body="$(k8s_admin POST "$u0/admin/retrain" '{"task": "smoke", "model_id": "smoke", "epochs": 1, "promote": true}')"
    [ "${body%% *}" = 202 ] || fail "POST /admin/retrain answered $body"
    job="$(echo "$body" | json_field 'd["job_id"]')"
    local t1 state
    t1=$(date +%s)
    while :; do
        body="$(k8s_admin GET "$u1/admin/jobs/$job")"
        state="$(echo "$body" | json_field 'd["state"]')"
        case "$state" in succeeded) break ;; failed|cancelled) fail "job $job $state: $body" ;; esac
        [ $(( $(date +%s) - t1 )) -lt "$K8S_JOB_TIMEOUT" ] || fail "job $job still $state after $K8S_JOB_TIMEOUT s"
        sleep 2  # within the admin key's rate
    done
    version="$(echo "$body" | json_field 'd["result"]["version"]')"
    since="$(echo "$body" | json_field 'd["finished_at"]')"
    since="$("$SPY" -c 'import sys, datetime; print(datetime.datetime.fromisoformat(sys.argv[1]).timestamp())' "$since")"
    if [ "$(echo "$body" | json_field 'd["result"]["promoted"]')" != True ]; then
        say "job $job: $version not promoted by the job ($(echo "$body" | json_field 'd["result"]["promotion"]')); promoting it through pod 1"
        since="$(date +%s.%N)"
        body="$(k8s_admin POST "$u1/admin/models/smoke/promote" "{\"version\": \"$version\"}")"
        [ "${body%% *}" = 200 ] || fail "promote $version answered $body"
    fi
    say "retraining job $job: $version trained by the worker pod in $(( $(date +%s) - t1 )) s ($(since))"
    client promotion "$u0" "$u1" --version "$version" --since "$since" --timeout 60 \
        | tee -a "$LOGS/k8s-findings.log" >&2 \
        || fail "promotion (see above)"

    STEP="k8s (a serve pod killed mid-traffic)"
    local psql="podman exec -e PGPASSWORD=$PG_PASSWORD privbert-postgres-pod-0-postgres psql -h 127.0.0.1 -p $pg -U privbert -d privbert -At"
    client kill "$u0" "$u1" --records "$edge_out/records.jsonl" --predict "$edge_out/predict.jsonl" \
        --kill "podman pod kill privbert-serve-1-pod-0 >/dev/null 2>&1" --kill-after 12 \
        --requests 40 --psql "$psql" --timeout 600 | tee -a "$LOGS/k8s-findings.log" >&2 \
        || fail "kill (see above)"
    podman pod start privbert-serve-1-pod-0 >/dev/null 2>&1 || fail "restarting serve pod 1"
    wait_for "$K8S_READY_TIMEOUT" "serve pod 1 /readyz 200 after its restart" k8s_ready "$u1"
    say "serve pod 1 started again: ready, serving $(k8s_admin GET "$u1/v1/models" | json_field '[m["version"] for m in d["models"]][0]') ($(since))"

    STEP="k8s (one key's rate limit over both pods)"
    client rate "$u0" "$u1" --rate "$K8S_RATE" --burst "$K8S_BURST" --requests 60 \
        | tee -a "$LOGS/k8s-findings.log" >&2 \
        || fail "rate (see above)"

    STEP="k8s (one key's budget over both pods)"
    client budget "$u0" "$u1" --predict "$edge_out/predict.jsonl" --requests 24 \
        | tee -a "$LOGS/k8s-findings.log" >&2 \
        || fail "budget (see above)"

    STEP="k8s (tripwire)"
    local needles="$WORK/needles" logs="$WORK/pod-logs" c hits
    mkdir -p "$logs"
    printf '%s\n' "$SMOKE_APP" "$SMOKE_RATE_KEY" "$SMOKE_BUDGET_KEY" "$SMOKE_ADMIN" \
        "$PG_PASSWORD" "${MARKERS[@]}" >"$needles"
    for c in $(podman ps -a --format '{{.Names}}' | grep -E '^privbert-(serve-[01]|worker|postgres)-pod'); do
        podman logs "$c" >"$logs/$c.log" 2>&1
    done
    [ "$(ls "$logs" | wc -l)" -ge 4 ] || fail "too few pod logs"
    hits="$(grep -rlaiF -f "$needles" "$logs" || true)"
    [ -z "$hits" ] || fail "a key, password or sentence word in: $(echo "$hits" | tr '\n' ' ')"
    say "tripwire: no key, password or marker word in $(ls "$logs" | wc -l) pod logs"

    STEP="k8s (down)"
    k8s_down
    say "k8s smoke: $(( $(date +%s) - t0 )) s after the build (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    echo "k8s smoke: ok"
}
