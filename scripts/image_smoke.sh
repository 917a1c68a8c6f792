# `scripts/image.sh smoke`, sourced by scripts/image.sh after the build (it uses ENGINE, BASE,
# SERVE_IMAGE, TRAIN_IMAGE, LOGS, ROOT, STEP, fail, say, need, image_exists, pull, CLEANUP).
#
# deploy/compose.yaml (serve + worker + PostgreSQL 15) end to end, on loopback ports only:
#  1. PostgreSQL up; a one-off train container migrates the database and bootstraps a tiny
#     dchi-text model (a random 2-layer BERT made here, 48 synthetic rows) into the
#     privbert-home volume, exported to classifier.onnx;
#  2. serve (no torch) and worker (train image) up; /readyz, the HEALTHCHECK, uid/gid 10001;
#  3. from this machine, `edge-agent privatize --post predict` and `--post records`;
#  4. POST /admin/retrain; the worker container trains; the new version is promoted and is
#     the one that answers predictions;
#  5. tripwire: no key, password or marker sentence word in any container's log or in either
#     volume; everything stopped and removed; each image's size; `smoke: ok`.

MARKERS=(zqxsmokemarker blorpvexquill)
# limits that only catch a hang (a shared 2-core machine can be 10x slower than a quiet one)
JOB_TIMEOUT="${PRIVBERT_SMOKE_JOB_TIMEOUT:-900}"
READY_TIMEOUT="${PRIVBERT_SMOKE_READY_TIMEOUT:-300}"

smoke_python() {  # the Python that makes the inputs and runs edge-agent on this machine
    STEP="smoke (this machine's python)"
    SPY="${PRIVBERT_PYTHON:-python3}"
    if ! PYTHONPATH="$ROOT" "$SPY" -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ("torch", "transformers", "pytest", "httpx", "onnxruntime")))' \
            >/dev/null 2>&1; then
        # shellcheck disable=SC1091
        . "$ROOT/scripts/_env.sh"
        ensure_venv
        SPY="$VENV/bin/python"
    fi
}

since() { echo "at +$(( $(date +%s) - SMOKE_T0 )) s"; }  # time since the smoke began

free_port() { "$SPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

smoke_inputs() {  # tiny BERT, train/dev TSV, the edge's inputs, in $WORK/in
    STEP="smoke (inputs)"
    PYTHONPATH="$ROOT" "$SPY" - "$WORK/in" "${MARKERS[@]}" 2>"$LOGS/smoke-inputs.log" <<'EOF' \
        || fail "making the inputs (see $LOGS/smoke-inputs.log)"
import sys
from pathlib import Path

from tests.conftest import make_full_tiny_bert
from tests.models.conftest import sentiment_texts

out, markers = Path(sys.argv[1]), sys.argv[2:]
make_full_tiny_bert(out / "tiny-bert")
for name, n, seed in (("train", 48, 0), ("dev", 16, 1), ("records", 40, 2)):
    texts, _, labels = sentiment_texts(n, seed)
    texts = [f"{t} {markers[i % len(markers)]}" for i, t in enumerate(texts)]
    (out / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{t}\t{y}\n" for t, y in zip(texts, labels, strict=True)))
(out / "predict.txt").write_text(f"a good fun movie {markers[0]}\n"
                                 f"an awful dull plot {markers[1]}\n")
EOF
    chmod -R a+rX "$WORK/in"
}

postgres_image() {
    STEP="smoke (PostgreSQL image)"
    if [ -n "${PRIVBERT_POSTGRES_IMAGE:-}" ]; then
        image_exists "$PRIVBERT_POSTGRES_IMAGE" || pull "$PRIVBERT_POSTGRES_IMAGE" \
            || fail "cannot pull PRIVBERT_POSTGRES_IMAGE=$PRIVBERT_POSTGRES_IMAGE"
        return 0
    fi
    if image_exists docker.io/library/postgres:15 || pull docker.io/library/postgres:15; then
        export PRIVBERT_POSTGRES_IMAGE=docker.io/library/postgres:15
        return 0
    fi
    export PRIVBERT_POSTGRES_IMAGE=localhost/privbert-postgres:15
    local log="$LOGS/build-postgres.log"
    say "building $PRIVBERT_POSTGRES_IMAGE (Debian's postgresql-15; log: $log)"
    if [ "$ENGINE" = docker ]; then
        docker build -q --network host --build-arg "BASE_IMAGE=$BASE" \
            -t "$PRIVBERT_POSTGRES_IMAGE" "$ROOT/deploy/postgres" >"$log" 2>&1
    else
        buildah build --isolation chroot --layers --format docker --build-arg "BASE_IMAGE=$BASE" \
            -t "$PRIVBERT_POSTGRES_IMAGE" "$ROOT/deploy/postgres" >"$log" 2>&1
    fi || fail "see $log (apt-get in the build: the base's Debian mirror must be reachable)," \
                "or set PRIVBERT_POSTGRES_IMAGE to a PostgreSQL 15 image"
}

# podman-compose from PyPI (pinned), in its own environment under $LOGS: Debian bookworm's
# 1.0.3 adds a bridge network to every container even with network_mode: host, which podman
# refuses ("cannot set multiple networks without bridge network mode").
PODMAN_COMPOSE_VERSION=1.5.0

podman_compose() {
    STEP="smoke (podman-compose $PODMAN_COMPOSE_VERSION)"
    local venv="$LOGS/podman-compose-venv"
    PODMAN_COMPOSE="$venv/bin/podman-compose"
    if [ -x "$PODMAN_COMPOSE" ] \
            && "$PODMAN_COMPOSE" --version 2>/dev/null | grep -q "version $PODMAN_COMPOSE_VERSION"; then
        return 0
    fi
    python3 -c 'import venv, ensurepip' 2>/dev/null || debian_install python3-venv
    rm -rf "$venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check \
        "podman-compose==$PODMAN_COMPOSE_VERSION" >"$LOGS/podman-compose.log" 2>&1 \
        || fail "pip install podman-compose==$PODMAN_COMPOSE_VERSION (see" \
                "$LOGS/podman-compose.log): set PIP_INDEX_URL / PIP_CERT"
}

compose() {
    if [ "$ENGINE" = docker ]; then
        docker compose -p "$PROJECT" -f "$ROOT/deploy/compose.yaml" "$@"
    else
        "$PODMAN_COMPOSE" --in-pod false -p "$PROJECT" -f "$ROOT/deploy/compose.yaml" "$@"
    fi
}

ctr() { if [ "$ENGINE" = docker ]; then docker "$@"; else podman "$@"; fi; }

container_of() {  # container_of SERVICE: the compose container's name
    ctr ps -a --format '{{.Names}}' | grep -E "^${PROJECT}[_-]$1[_-]1$" | head -n1
}

http() {  # http METHOD PATH [JSON] (admin key): prints "STATUS BODY"
    "$SPY" - "$1" "http://127.0.0.1:$PRIVBERT_PORT$2" "${3:-}" <<'EOF'
import os, sys, urllib.error, urllib.request
method, url, body = sys.argv[1:4]
req = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                             headers={"Authorization": "Bearer " + os.environ["SMOKE_ADMIN"],
                                      "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, type(e).__name__)
EOF
}

json_field() {  # json_field EXPR < "STATUS BODY": EXPR of the body as d ("" if it is not JSON)
    "$SPY" -c '
import json, sys
try:
    d = json.loads(sys.stdin.read().split(" ", 1)[1])
    print(eval(sys.argv[1], {}, {"d": d}))
except (ValueError, IndexError, KeyError, TypeError):
    print("")' "$1"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
    local limit="$1" what="$2" t0
    shift 2
    t0=$(date +%s)
    until "$@" >/dev/null 2>&1; do
        [ $(( $(date +%s) - t0 )) -lt "$limit" ] || fail "$what not within $limit s"
        sleep 1
    done
}

ready() { [ "$(http GET /readyz | cut -d' ' -f1)" = 200 ]; }

edge() {  # edge ARGS...: edge-agent on this machine against the serve container; it trusts
    # the smoke's tiny bundle, $SMOKE_BUNDLE (a test table the text floor refuses, as it should)
    PRIVBERT_API_KEY="$SMOKE_APP" PRIVBERT_CACHE="$WORK/edge-cache" PYTHONPATH="$ROOT" \
        PRIVBERT_TRUSTED_BUNDLES="$SMOKE_BUNDLE" "$SPY" -m edge_agent.cli "$@"
}

served_version() { http GET /v1/models | json_field '[m["version"] for m in d["models"] if m["id"] == "smoke"][0]'; }
served_bundle() { http GET /v1/models | json_field '[m["bundle_id"] for m in d["models"] if m["id"] == "smoke"][0]'; }

smoke_down() {  # the containers' logs into $LOGS (to read after a failure), then remove all
    local svc name
    for svc in postgres serve worker; do
        name="$(container_of "$svc" 2>/dev/null || true)"
        [ -z "$name" ] || ctr logs "$name" >"$LOGS/smoke-$svc.log" 2>&1 || true
    done
    compose down -v >>"$LOGS/smoke-compose.log" 2>&1 || true
    ctr volume rm -f "${PROJECT}_privbert-home" "${PROJECT}_privbert-pg" >/dev/null 2>&1 || true
}

tripwire() {  # no key, password or marker in the containers' logs or in the volumes
    STEP="smoke (tripwire)"
    local needles="$WORK/needles" logs="$WORK/logs" svc name vol dir hits
    mkdir -p "$logs"
    printf '%s\n' "$SMOKE_APP" "$SMOKE_ADMIN" "$PRIVBERT_PG_PASSWORD" "${MARKERS[@]}" >"$needles"
    for svc in postgres serve worker; do
        name="$(container_of "$svc")"
        [ -n "$name" ] || fail "no $svc container to read the log of"
        ctr logs "$name" >"$logs/$svc.log" 2>&1
    done
    cp "$LOGS"/smoke-bootstrap.log "$logs/"
    local dirs=("$logs")
    for vol in privbert-home privbert-pg; do
        dir="$(ctr volume inspect -f '{{.Mountpoint}}' "${PROJECT}_$vol")" \
            || fail "no volume ${PROJECT}_$vol"
        [ -d "$dir" ] || fail "volume ${PROJECT}_$vol is not at $dir on this machine"
        dirs+=("$dir")
    done
    [ "$(find "${dirs[@]}" -type f | wc -l)" -gt 20 ] || fail "too few files to search"
    hits="$(grep -rlaiF -f "$needles" "${dirs[@]}" || true)"
    [ -z "$hits" ] || fail "a key, password or sentence word found in: $(echo "$hits" | tr '\n' ' ')"
    say "tripwire: no key, password or marker word in $(find "${dirs[@]}" -type f | wc -l) files" \
        "(3 container logs, the bootstrap's output, both volumes)"
}

smoke() {
    local job body state version uid
    SMOKE_T0=$(date +%s)
    smoke_python
    [ "$ENGINE" = docker ] || podman_compose
    WORK="$(mktemp -d /var/tmp/privbert-smoke.XXXXXX)"
    chmod 755 "$WORK"
    CLEANUP+=("rm -rf '$WORK'")
    PROJECT="privbert-smoke-$$"
    smoke_inputs
    postgres_image
    SMOKE_APP="app-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    SMOKE_ADMIN="adm-$("$SPY" -c 'import secrets; print(secrets.token_hex(16))')"
    export SMOKE_ADMIN PRIVBERT_API_KEYS="$SMOKE_APP" PRIVBERT_ADMIN_KEYS="$SMOKE_ADMIN"
    export PRIVBERT_PG_PASSWORD="pg-$("$SPY" -c 'import secrets; print(secrets.token_hex(12))')"
    export PRIVBERT_PORT PRIVBERT_PG_PORT PRIVBERT_HOST=127.0.0.1 PRIVBERT_PG_LISTEN=127.0.0.1
    PRIVBERT_PORT="$(free_port)"
    PRIVBERT_PG_PORT="$(free_port)"
    export PRIVBERT_SERVE_IMAGE="$SERVE_IMAGE" PRIVBERT_TRAIN_IMAGE="$TRAIN_IMAGE"
    CLEANUP=("smoke_down" "${CLEANUP[@]}")

    STEP="smoke (PostgreSQL up)"
    compose up -d postgres >"$LOGS/smoke-compose.log" 2>&1 || fail "see $LOGS/smoke-compose.log"
    wait_for "$READY_TIMEOUT" "PostgreSQL ready" ctr exec "$(container_of postgres)" pg_isready -q -h 127.0.0.1

    STEP="smoke (bootstrap in a train container)"
    # shellcheck disable=SC2016
    compose run --rm -v "$WORK/in:/in:ro" worker sh -c 'set -e
        cloud-api db upgrade
        mkdir -p "$PRIVBERT_HOME/bases" && cp -r /in/tiny-bert "$PRIVBERT_HOME/bases/tiny"
        cloud-api bootstrap --data /in/train.tsv --dev /in/dev.tsv --mechanism dchi-text \
            --eta 5 --base "$PRIVBERT_HOME/bases/tiny" --model-id smoke --limit 0 \
            --epochs 1 --device cpu --no-progress' >"$LOGS/smoke-bootstrap.log" 2>&1 \
        || fail "see $LOGS/smoke-bootstrap.log"
    grep -q "model=smoke version=v1 promoted" "$LOGS/smoke-bootstrap.log" \
        || fail "no promoted v1 (see $LOGS/smoke-bootstrap.log)"
    say "bootstrap: $(grep -m1 '^model=' "$LOGS/smoke-bootstrap.log") ($(since))"

    STEP="smoke (serve and worker up)"
    compose up -d serve worker >>"$LOGS/smoke-compose.log" 2>&1 || fail "see $LOGS/smoke-compose.log"
    wait_for "$READY_TIMEOUT" "serve /readyz 200" ready
    ctr healthcheck run "$(container_of serve)" >/dev/null 2>&1 \
        || [ "$ENGINE" = docker ] || fail "the serve container's HEALTHCHECK did not pass"
    for svc in serve worker; do
        uid="$(ctr exec "$(container_of "$svc")" id -u):$(ctr exec "$(container_of "$svc")" id -g)"
        [ "$uid" = "10001:10001" ] || fail "$svc runs as $uid, not 10001:10001"
    done
    ctr exec "$(container_of serve)" python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is not None)' \
        || fail "the serve image has torch"
    say "serve ready on 127.0.0.1:$PRIVBERT_PORT (HEALTHCHECK passed; serve and worker run as 10001:10001; no torch in serve; $(since))"
    SMOKE_BUNDLE="$(served_bundle)"  # the same after retraining: one base, one bundle
    [ -n "$SMOKE_BUNDLE" ] || fail "GET /v1/models names no bundle for smoke"

    STEP="smoke (edge-agent --post predict)"
    edge privatize "$WORK/in/predict.txt" --mechanism dchi-text --eta 5 \
        --server "http://127.0.0.1:$PRIVBERT_PORT" --model smoke --post predict --no-progress \
        >"$WORK/predict.jsonl" 2>"$LOGS/smoke-edge.log" || fail "see $LOGS/smoke-edge.log"
    [ "$(wc -l <"$WORK/predict.jsonl")" -eq 2 ] || fail "not 2 predictions (see $LOGS/smoke-edge.log)"

    STEP="smoke (edge-agent --post records)"
    edge privatize "$WORK/in/records.tsv" --tsv --mechanism dchi-text --eta 5 \
        --server "http://127.0.0.1:$PRIVBERT_PORT" --model smoke --post records --task smoke \
        --no-progress >"$WORK/records.out" 2>>"$LOGS/smoke-edge.log" \
        || fail "see $LOGS/smoke-edge.log"

    say "edge-agent on this machine: 2 predictions, 40 records stored ($(since))"

    STEP="smoke (retraining job)"
    body="$(http POST /admin/retrain '{"task": "smoke", "model_id": "smoke", "epochs": 1, "promote": true}')"
    [ "${body%% *}" = 202 ] || fail "POST /admin/retrain answered $body"
    job="$(echo "$body" | json_field 'd["job_id"]')"
    local t1
    t1=$(date +%s)
    while :; do
        body="$(http GET "/admin/jobs/$job")"
        state="$(echo "$body" | json_field 'd["state"]')"
        case "$state" in succeeded) break ;; failed|cancelled) fail "job $job $state: $body" ;; esac
        [ $(( $(date +%s) - t1 )) -lt "$JOB_TIMEOUT" ] || fail "job $job still $state" \
            "after $JOB_TIMEOUT s (progress: $(echo "$body" | json_field 'd.get("progress")');" \
            "PRIVBERT_SMOKE_JOB_TIMEOUT to wait longer on a busy machine)"
        sleep 2
    done
    version="$(echo "$body" | json_field 'd["result"]["version"]')"
    if [ "$(echo "$body" | json_field 'd["result"]["promoted"]')" != True ]; then
        say "job $job: $version not promoted by the job ($(echo "$body" | json_field 'd["result"]["promotion"]')); promoting it by hand"
        body="$(http POST /admin/models/smoke/promote "{\"version\": \"$version\"}")"
        [ "${body%% *}" = 200 ] || fail "promote $version answered $body"
    fi
    local t2 now
    t2=$(date +%s)
    until [ "$(served_version)" = "$version" ]; do
        [ $(( $(date +%s) - t2 )) -lt 60 ] || fail "$version not served within 60 s"
        sleep 1
    done
    edge privatize "$WORK/in/predict.txt" --mechanism dchi-text --eta 5 \
        --server "http://127.0.0.1:$PRIVBERT_PORT" --model smoke --no-progress \
        >"$WORK/payloads.jsonl" 2>>"$LOGS/smoke-edge.log" || fail "see $LOGS/smoke-edge.log"
    body="$("$SPY" -c 'import json, sys; print(json.dumps({"payloads": [json.loads(x)["payload"] for x in open(sys.argv[1])]}))' "$WORK/payloads.jsonl")"
    body="$(http POST /v1/models/smoke/predict "$body")"
    [ "${body%% *}" = 200 ] || fail "predict answered $body"
    now="$(echo "$body" | json_field 'd["version"]')"
    [ "$now" = "$version" ] || fail "predictions come from $now, not $version"
    say "retraining job $job: $version trained by the worker container, promoted, serving predictions ($(since))"

    tripwire
    STEP="smoke (stop)"
    compose down >>"$LOGS/smoke-compose.log" 2>&1 || fail "compose down (see $LOGS/smoke-compose.log)"
    smoke_down
    local img
    for img in "$SERVE_IMAGE" "$TRAIN_IMAGE"; do
        say "size $img: $(( $(image_size "$img") / 1000000 )) MB"
    done
    say "smoke: $(( $(date +%s) - SMOKE_T0 )) s after the build (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    echo "smoke: ok"
}
