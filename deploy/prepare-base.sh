#!/bin/sh
# Run once in each image's base (Dockerfile): Python 3 where the base has none (CUDA base
# images), and the service account privbert with a FIXED uid and gid, 10001:10001, whatever
# ids the base already uses (the Dockerfile's USER names the numbers).
set -eu
uid=10001
gid=10001
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends python3 python3-venv
    rm -rf /var/lib/apt/lists/*
fi
python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "prepare-base: the base image's python3 is older than 3.11" >&2; exit 1; }
groupadd --system --gid "$gid" privbert
useradd --system --uid "$uid" --gid "$gid" --home-dir /var/lib/privbert --no-create-home \
    --shell /usr/sbin/nologin privbert
install -d -o "$uid" -g "$gid" -m 0750 /var/lib/privbert
rm -rf /usr/share/doc/* /usr/share/man/* /var/cache/apt/archives/*.deb
