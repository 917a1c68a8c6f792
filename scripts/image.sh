#!/usr/bin/env bash
# privbert's container images (Dockerfile, docs/deployment.md):
#
#   scripts/image.sh build    the serve and train images, tagged only when a build succeeds
#   scripts/image.sh smoke    build (cached layers), then run them end to end; `smoke: ok`
#   scripts/image.sh k8s      build, then deploy/k8s with podman kube play (scripts/k8s_smoke.sh)
#   scripts/image.sh base     only the base image (pulled, or made with debootstrap)
#
# Engine: `docker build` where a Docker engine answers, else `buildah build --isolation
# chroot` (no daemon; Debian's buildah, podman, runc and debootstrap are installed with
# apt-get when missing and this runs as root; smoke adds podman-compose from PyPI, pinned).
# PRIVBERT_ENGINE=docker|buildah chooses.
#
# Environment (all optional):
#   PRIVBERT_SERVE_IMAGE, PRIVBERT_TRAIN_IMAGE   tags (localhost/privbert-serve:latest, ...-train)
#   PRIVBERT_BASE_IMAGE     base of both images; default python:3.11-slim, and where that cannot
#                           be pulled a Debian bookworm made with debootstrap
#                           (localhost/privbert-base:bookworm, from PRIVBERT_DEBIAN_MIRROR)
#   PRIVBERT_TRAIN_BASE_IMAGE, PRIVBERT_TORCH_VERSION, PRIVBERT_TORCH_INDEX   CUDA train image
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_TRUSTED_HOST   package sources of
#                           the build (build arguments; local folders are served to the build
#                           on a loopback port while it runs)
#   PIP_CERT                CA bundle for pip's HTTPS (a build secret, never in a layer)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVE_IMAGE="${PRIVBERT_SERVE_IMAGE:-localhost/privbert-serve:latest}"
TRAIN_IMAGE="${PRIVBERT_TRAIN_IMAGE:-localhost/privbert-train:latest}"
DEFAULT_BASE="python:3.11-slim"
DEBOOTSTRAP_BASE="localhost/privbert-base:bookworm"
MIRROR="${PRIVBERT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
LOGS="${PRIVBERT_IMAGE_LOGS:-$ROOT/out/image}"
STEP="setup"
PIDFILE=""    # ids of the background processes this script started (package servers)
CLEANUP=()    # commands run at exit

fail() {  # one line: the step that failed and what to do; exit 1
    echo "image.sh: $STEP failed: $*" >&2
    exit 1
}
say() { echo "image.sh: $*" >&2; }

at_exit() {
    local pid cmd
    for cmd in "${CLEANUP[@]}"; do eval "$cmd" >/dev/null 2>&1 || true; done
    if [ -n "$PIDFILE" ] && [ -f "$PIDFILE" ]; then
        while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$PIDFILE"
        rm -f "$PIDFILE"
    fi
}
trap at_exit EXIT

# -- tools -----------------------------------------------------------------------------------
debian_install() {  # debian_install PACKAGE...: apt-get install when root, else fail
    [ "$#" -gt 0 ] || return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        fail "missing $*: install them (Debian: apt-get install $*), or run as root"
    fi
    say "installing $* (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >"$LOGS/apt.log" 2>&1 \
        || { apt-get update -q >>"$LOGS/apt.log" 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >>"$LOGS/apt.log" 2>&1; } \
        || fail "apt-get install $* (see $LOGS/apt.log): check the machine's apt sources"
}

need() {  # need CMD=PACKAGE...: install the packages whose command is missing
    local want=() pair
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null 2>&1 || want+=("${pair#*=}")
    done
    debian_install "${want[@]}"
}

docker_engine() { command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; }

choose_engine() {
    STEP="engine"
    ENGINE="${PRIVBERT_ENGINE:-}"
    if [ -z "$ENGINE" ]; then
        if docker_engine; then ENGINE=docker; else ENGINE=buildah; fi
    fi
    case "$ENGINE" in
        docker) docker_engine || fail "PRIVBERT_ENGINE=docker but no Docker engine answers" \
                    "(start it, or unset PRIVBERT_ENGINE to build with buildah)" ;;
        buildah) need buildah=buildah podman=podman runc=runc ;;
        *) fail "PRIVBERT_ENGINE=$ENGINE: use docker or buildah" ;;
    esac
}

# podman's settings for this script only: runc (crun fails on setrlimit and cgroups on
# some hosts) and explicit ulimits, in a containers.conf named by CONTAINERS_CONF
podman_conf() {
    local conf="$LOGS/containers.conf"
    cat >"$conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
events_logger = "file"
EOF
    export CONTAINERS_CONF="$conf"
}

image_exists() {
    if [ "$ENGINE" = docker ]; then docker image inspect "$1" >/dev/null 2>&1
    else podman image exists "$1"; fi
}

pull() {
    if [ "$ENGINE" = docker ]; then timeout 120 docker pull -q "$1" >/dev/null 2>&1
    else timeout 120 podman pull -q "$1" >/dev/null 2>&1; fi
}

# -- the base --------------------------------------------------------------------------------
debootstrap_base() {
    STEP="base (debootstrap $MIRROR)"
    need debootstrap=debootstrap
    local dir tarball
    dir="$(mktemp -d /var/tmp/privbert-rootfs.XXXXXX)"
    CLEANUP+=("rm -rf '$dir'")
    say "making $DEBOOTSTRAP_BASE with debootstrap (bookworm, python3; about 2 minutes)"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir/rootfs" \
        "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 \
        || fail "see $LOGS/debootstrap.log; set PRIVBERT_DEBIAN_MIRROR to a reachable" \
                "Debian mirror, or PRIVBERT_BASE_IMAGE to an image with python3 >= 3.11"
    (cd "$dir/rootfs" && rm -rf var/cache/apt/archives/*.deb var/cache/apt/*.bin \
        var/lib/apt/lists/* usr/share/doc/* usr/share/man/* usr/share/locale/* usr/share/info/*)
    tarball="$dir/rootfs.tar"
    tar -C "$dir/rootfs" -cf "$tarball" . || fail "tar of the debootstrap root in $dir"
    if [ "$ENGINE" = docker ]; then
        docker import "$tarball" "$DEBOOTSTRAP_BASE" >/dev/null 2>>"$LOGS/debootstrap.log"
    else
        podman import -q "$tarball" "$DEBOOTSTRAP_BASE" >/dev/null 2>>"$LOGS/debootstrap.log"
    fi || fail "importing $tarball as $DEBOOTSTRAP_BASE"
}

choose_base() {
    STEP="base"
    if [ -n "${PRIVBERT_BASE_IMAGE:-}" ]; then
        BASE="$PRIVBERT_BASE_IMAGE"
        image_exists "$BASE" || pull "$BASE" \
            || fail "cannot pull PRIVBERT_BASE_IMAGE=$BASE: set it to an image this machine" \
                    "has or can pull, or unset it (debootstrap base)"
    elif image_exists "$DEFAULT_BASE" || pull "$DEFAULT_BASE"; then
        BASE="$DEFAULT_BASE"
    else
        BASE="$DEBOOTSTRAP_BASE"
        image_exists "$BASE" || debootstrap_base
    fi
    TRAIN_BASE="${PRIVBERT_TRAIN_BASE_IMAGE:-$BASE}"
    if [ "$TRAIN_BASE" != "$BASE" ]; then
        image_exists "$TRAIN_BASE" || pull "$TRAIN_BASE" \
            || fail "cannot pull PRIVBERT_TRAIN_BASE_IMAGE=$TRAIN_BASE: set it to an image" \
                    "this machine has or can pull"
    fi
    say "base $BASE${TRAIN_BASE:+ (train: $TRAIN_BASE)}"
}

# -- package sources -------------------------------------------------------------------------
serve_dir() {  # serve_dir DIR: a loopback HTTP server for DIR; prints its URL
    # The port is derived from DIR (the next free one from there): the URL is a build
    # argument, and the same URL on every build keeps the layers that use it cached.
    local portfile
    portfile="$(mktemp)"
    python3 - "$1" "$portfile" >/dev/null 2>"$LOGS/pkgserver.log" <<'EOF' &
import functools, http.server, sys, zlib
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
handler.log_message = lambda *a: None
start = 20000 + zlib.crc32(sys.argv[1].encode()) % 20000
for port in range(start, start + 200):
    try:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        break
    except OSError:
        continue
else:
    sys.exit(f"no free port in {start}..{start + 199}")
open(sys.argv[2], "w").write(str(srv.server_address[1]))
srv.serve_forever()
EOF
    echo "$!" >>"$PIDFILE"  # (this runs in a command substitution: a file, not an array)
    for _ in $(seq 50); do [ -s "$portfile" ] && break; sleep 0.1; done
    [ -s "$portfile" ] || fail "a loopback server for $1 did not start ($LOGS/pkgserver.log)"
    echo "http://127.0.0.1:$(cat "$portfile")/"
    rm -f "$portfile"
}

local_path() {  # local_path ENTRY: the folder of a path or file:// URL, else nothing
    local p="$1"
    case "$p" in file://*) p="${p#file://}" ;; *://*) return 0 ;; esac
    [ -d "$p" ] && (cd "$p" && pwd)
    return 0
}

as_url() {  # as_url ENTRY KIND: the entry as the build can reach it (find-links | index)
    local entry="$1" dir
    dir="$(local_path "$entry")"
    if [ -z "$dir" ]; then
        case "$entry" in *://*) echo "$entry" ;;
            *) say "warning: pip source $entry is not a folder; left out" ;; esac
        return 0
    fi
    if [ "$2" = index ]; then  # a file index's pages link to ../../files: serve its parent
        echo "$(serve_dir "$(dirname "$dir")")$(basename "$dir")/"
    else
        serve_dir "$dir"
    fi
}

pip_sources() {
    STEP="package sources"
    BUILD_ARGS=()
    local entry urls
    urls=""
    for entry in ${PIP_FIND_LINKS:-}; do urls+="$(as_url "$entry" find-links) "; done
    BUILD_ARGS+=(--build-arg "PIP_FIND_LINKS=${urls% }")
    [ -z "${PIP_INDEX_URL:-}" ] \
        || BUILD_ARGS+=(--build-arg "PIP_INDEX_URL=$(as_url "$PIP_INDEX_URL" index)")
    urls=""
    for entry in ${PIP_EXTRA_INDEX_URL:-}; do urls+="$(as_url "$entry" index) "; done
    BUILD_ARGS+=(--build-arg "PIP_EXTRA_INDEX_URL=${urls% }")
    BUILD_ARGS+=(--build-arg "PIP_TRUSTED_HOST=${PIP_TRUSTED_HOST:-}")
    local ca="${PIP_CERT:-}"
    if [ -n "$ca" ]; then
        [ -s "$ca" ] || fail "PIP_CERT=$ca is not a readable file: set it to the CA bundle"
        BUILD_ARGS+=(--secret "id=pip_ca,src=$ca")
    fi
    # torch: from a local wheel of TORCH_VERSION when the find-links folders hold one, else
    # from PRIVBERT_TORCH_INDEX (default the Dockerfile's, download.pytorch.org's CPU index)
    TORCH_VERSION="${PRIVBERT_TORCH_VERSION:-2.13.0+cpu}"
    BUILD_ARGS+=(--build-arg "TORCH_VERSION=$TORCH_VERSION")
    local torch_index="${PRIVBERT_TORCH_INDEX-}" local_torch=""
    for entry in ${PIP_FIND_LINKS:-}; do
        entry="$(local_path "$entry")"
        [ -n "$entry" ] && compgen -G "$entry/torch-${TORCH_VERSION}-*.whl" >/dev/null \
            && local_torch="$entry"
    done
    if [ -n "$local_torch" ] && [ -z "${PRIVBERT_TORCH_INDEX+set}" ]; then
        say "torch $TORCH_VERSION from $local_torch"
        torch_index=""
        BUILD_ARGS+=(--build-arg "TORCH_INDEX=")
    elif [ -n "${PRIVBERT_TORCH_INDEX+set}" ]; then
        BUILD_ARGS+=(--build-arg "TORCH_INDEX=$torch_index")
    fi
}

# -- build -----------------------------------------------------------------------------------
explain_build_failure() {  # explain_build_failure LOG: what to set, from pip's messages
    local log="$1"
    if grep -qE "CERTIFICATE_VERIFY_FAILED|SSLError|certificate verify failed" "$log"; then
        echo "TLS certificate not trusted: set PIP_CERT to the CA bundle (see $log)"
    elif grep -qE "Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|ProxyError|Network is unreachable|ConnectTimeout" "$log"; then
        echo "a package index is unreachable: set PIP_INDEX_URL (or PIP_EXTRA_INDEX_URL," \
             "PIP_FIND_LINKS) to one this machine reaches (see $log)"
    elif grep -qE "No matching distribution|Could not find a version" "$log"; then
        echo "$(grep -m1 -oE "(No matching distribution found for|Could not find a version that satisfies the requirement) [^ ]+" "$log"):" \
             "set PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL to a source of it (torch:" \
             "PRIVBERT_TORCH_INDEX or a folder with its wheel; see $log)"
    else
        echo "see $log"
    fi
}

build_target() {  # build_target TARGET TAG
    local target="$1" tag="$2" log iid t0
    STEP="build $target"
    log="$LOGS/build-$target.log"
    iid="$LOGS/$target.iid"
    rm -f "$iid"
    t0=$(date +%s)
    say "building $target -> $tag (log: $log)"
    local args=(--target "$target" --iidfile "$iid" --build-arg "BASE_IMAGE=$BASE"
                --build-arg "TRAIN_BASE_IMAGE=$TRAIN_BASE" "${BUILD_ARGS[@]}" -f "$ROOT/Dockerfile")
    if [ "$ENGINE" = docker ]; then
        DOCKER_BUILDKIT=1 docker build --network host "${args[@]}" "$ROOT" >"$log" 2>&1
    else
        buildah build --isolation chroot --layers --format docker "${args[@]}" "$ROOT" \
            >"$log" 2>&1
    fi || fail "$(explain_build_failure "$log")"
    [ -s "$iid" ] || fail "no image id written (see $log)"
    # tagged only now: a failed build leaves no image under the tag
    if [ "$ENGINE" = docker ]; then docker tag "$(cat "$iid")" "$tag"
    else buildah tag "$(cat "$iid")" "$tag"; fi || fail "tagging $tag"
    say "built $tag in $(( $(date +%s) - t0 )) s"
}

image_size() {  # bytes
    if [ "$ENGINE" = docker ]; then docker image inspect -f '{{.Size}}' "$1"
    else podman image inspect -f '{{.Size}}' "$1"; fi
}

cmd_build() {
    local t0
    t0=$(date +%s)
    choose_engine
    [ "$ENGINE" = docker ] || podman_conf
    choose_base
    pip_sources
    build_target serve "$SERVE_IMAGE"
    build_target train "$TRAIN_IMAGE"
    say "build: both images in $(( $(date +%s) - t0 )) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
}

main() {
    mkdir -p "$LOGS"
    PIDFILE="$LOGS/.pids.$$"
    case "${1:-}" in
        build) cmd_build ;;
        base) choose_engine; choose_base ;;
        smoke) cmd_build; . "$ROOT/scripts/image_smoke.sh"; smoke ;;
        k8s) cmd_build; . "$ROOT/scripts/image_smoke.sh"; . "$ROOT/scripts/k8s_smoke.sh"
             k8s_smoke ;;
        *) echo "usage: scripts/image.sh build|smoke|k8s|base" >&2; exit 2 ;;
    esac
}

main "$@"
