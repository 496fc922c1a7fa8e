#!/bin/bash
# Builds the runner image on a Docker engine from Debian's packages and PyPI only: a Debian bookworm
# root filesystem (debootstrap, cached by its package list) imported as the base image, then the
# project's Dockerfiles on top. The result is saved to the cache keyed by the content of its
# inputs and loaded from there next time.
#
# Usage: DOCKER_HOST=unix:///path/docker.sock deploy/k8s-local/images.sh [TAG]   (prints the runner image)
#        deploy/k8s-local/images.sh --rootfs                                   (only the root filesystem)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE_ROOT=${RUNPLANE_K8S_CACHE:-/var/cache/runplane}
TAG=${1:-0.1.0}
SUITE=bookworm
PACKAGES=python3,python3-venv,git,ca-certificates,passwd
BASE=runplane-base:debian-$SUITE
ROOTFS=$CACHE_ROOT/rootfs-$SUITE-$(echo "$SUITE $PACKAGES" | sha256sum | cut -c1-12).tar

log() { echo "images: $*" >&2; }

make_rootfs() {
    [ -f "$ROOTFS" ] && return 0
    mkdir -p "$CACHE_ROOT"
    exec 8>"$ROOTFS.lock"
    flock 8
    [ -f "$ROOTFS" ] && return 0
    local uri tmp t0=$SECONDS
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
          || awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
    tmp=$(mktemp -d "$CACHE_ROOT/rootfs.XXXXXX")
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/root" "$uri" >"$tmp/debootstrap.log" 2>&1 \
        || { tail -20 "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; return 1; }
    # The machine's trust store, so pip in the image reaches PyPI the way this machine does.
    cp /etc/ssl/certs/ca-certificates.crt "$tmp/root/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$tmp"/root/var/cache/apt/archives/*.deb "$tmp"/root/var/lib/apt/lists/*
    tar -C "$tmp/root" -cf "$ROOTFS.tmp" . && mv "$ROOTFS.tmp" "$ROOTFS"
    rm -rf "$tmp"
    log "root filesystem made in $((SECONDS - t0)) s"
}

content_key() {
    (cd "$ROOT" && find pyproject.toml README.md runplane api orchestrator queuer_worker dispatcher runner proto \
        deploy/docker -type f -not -path '*/__pycache__/*' -not -name '*.pyc' | LC_ALL=C sort \
        | xargs sha256sum; echo "$ROOTFS") | sha256sum | cut -c1-16
}

make_rootfs
[ "${1:-}" = --rootfs ] && { echo "$ROOTFS"; exit 0; }

runner=runplane-runner:$TAG
saved=$CACHE_ROOT/images/runplane-runner-$TAG-$(content_key).tar
if [ -f "$saved" ]; then
    docker load -q -i "$saved" >/dev/null
else
    t0=$SECONDS
    docker import --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' "$ROOTFS" "$BASE" >/dev/null
    docker build -q --network host --build-arg "PYTHON_IMAGE=$BASE" -f "$ROOT/deploy/docker/Dockerfile" \
        -t "runplane:$TAG" "$ROOT" >/dev/null
    docker build -q --network host --build-arg "BASE=runplane:$TAG" -f "$ROOT/deploy/docker/Dockerfile.runner" \
        -t "$runner" "$ROOT" >/dev/null
    log "images built in $((SECONDS - t0)) s"
    mkdir -p "$CACHE_ROOT/images"
    rm -f "$CACHE_ROOT"/images/runplane-runner-"$TAG"-*.tar
    docker save -o "$saved.tmp" "$runner" && mv "$saved.tmp" "$saved"
fi
echo "$runner"
