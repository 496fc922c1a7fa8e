#!/bin/bash
# Builds the runner image on a Docker engine from Debian's packages and PyPI only: a Debian bookworm
# root filesystem (debootstrap, cached by its package list) imported as the base image, then the
# project's Dockerfiles on top. The runner image is saved to the cache keyed by the content of its
# inputs and loaded from there next time; on a miss (the sources changed) the slow layers (the
# Python dependencies, dbt) come from a saved earlier build, keyed by pyproject.toml and the
# Dockerfiles, so only the project's own layers are built again.
#
# Usage: DOCKER_HOST=unix:///path/docker.sock deploy/k8s-local/images.sh [TAG]   (prints the runner image)
#        DOCKER_HOST=... deploy/k8s-local/images.sh --save [TAG]   (into the cache only; nothing is loaded on a hit)
#        deploy/k8s-local/images.sh --saved [TAG]   (prints the saved image's path; fails when it is not saved)
#        deploy/k8s-local/images.sh --rootfs                                   (only the root filesystem)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE_ROOT=${RUNPLANE_K8S_CACHE:-/var/cache/runplane}
MODE=load
case ${1:-} in
    --save|--saved) MODE=${1#--}; shift ;;
esac
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

# The inputs of the runner image, each file by content: what decides whether a saved image is reused.
content_key() {
    (cd "$ROOT" && find .dockerignore pyproject.toml README.md runplane api client orchestrator queuer_worker scheduler dispatcher runner \
        proto deploy/docker deploy/dbt-*.txt -type f -not -path '*/__pycache__/*' -not -name '*.pyc' | LC_ALL=C sort \
        | xargs sha256sum; echo "$ROOTFS") | sha256sum | cut -c1-16
}

# The inputs of the slow layers (the root filesystem, the Python dependencies, dbt and its adapters):
# a change to the sources alone keeps this key, so the build reuses those layers.
layers_key() {
    (cd "$ROOT" && sha256sum pyproject.toml deploy/docker/Dockerfile deploy/docker/Dockerfile.runner deploy/dbt-*.txt \
        && echo "$ROOTFS") | sha256sum | cut -c1-16
}

# Keep the newest $KEEP files matching a pattern (several checkouts share the cache: no one evicts
# the others' image at once).
prune() {
    local keep=$1; shift
    ls -1t "$@" 2>/dev/null | tail -n +"$((keep + 1))" | xargs -r rm -f
}

runner=runplane-runner:$TAG
images=$CACHE_ROOT/images
if [ "$MODE" = saved ]; then
    saved=$images/runplane-runner-$TAG-$(content_key).tar
    [ -f "$saved" ] && [ -f "$ROOTFS" ] && { echo "$saved"; exit 0; }
    exit 1
fi

make_rootfs
[ "$TAG" = --rootfs ] && { echo "$ROOTFS"; exit 0; }

saved=$images/runplane-runner-$TAG-$(content_key).tar
mkdir -p "$images"
load_saved() {
    local t0=$SECONDS
    docker load -q -i "$saved" >/dev/null
    touch "$saved"
    log "runner image loaded from $saved in $((SECONDS - t0)) s"
    echo "$runner"
}
if [ -f "$saved" ]; then
    if [ "$MODE" = save ]; then echo "$saved"; else load_saved; fi
    exit 0
fi
# One build of an image at a time: a build of the same content already under way (`make test`
# starts one beside the tests) is waited for and its image loaded, not built a second time.
exec 7>"$saved.lock"
flock 7
if [ -f "$saved" ]; then
    if [ "$MODE" = save ]; then echo "$saved"; else load_saved; fi
    exit 0
fi

# A miss: build, reusing the slow layers of an earlier build. The classic builder takes a loaded
# image's layers as cache (--cache-from) when its history matches, so the base image is loaded
# with them rather than imported again (an import is a new image every time).
t0=$SECONDS
layers=$images/runplane-build-layers-$(layers_key).tar
if [ -f "$layers" ]; then
    docker load -q -i "$layers" >/dev/null
    touch "$layers"
fi
docker image inspect "$BASE" >/dev/null 2>&1 \
    || docker import --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' "$ROOTFS" "$BASE" >/dev/null
cache=()
for image in runplane-build:cache runplane-dbt:cache; do
    docker image inspect "$image" >/dev/null 2>&1 && cache+=(--cache-from "$image")
done
build() { docker build -q --network host --build-arg "PYTHON_IMAGE=$BASE" "${cache[@]}" "$@" "$ROOT" >/dev/null; }
build -f "$ROOT/deploy/docker/Dockerfile" --target build -t runplane-build:cache
build -f "$ROOT/deploy/docker/Dockerfile.runner" --target dbt -t runplane-dbt:cache
cache+=(--cache-from runplane-build:cache --cache-from runplane-dbt:cache)
build -f "$ROOT/deploy/docker/Dockerfile" -t "runplane:$TAG"
build -f "$ROOT/deploy/docker/Dockerfile.runner" --build-arg "BASE=runplane:$TAG" -t "$runner"
log "images built in $((SECONDS - t0)) s"
if [ ! -f "$layers" ]; then
    docker save -o "$layers.tmp" "$BASE" runplane-build:cache runplane-dbt:cache && mv "$layers.tmp" "$layers"
    prune 2 "$images"/runplane-build-layers-*.tar
fi
docker save -o "$saved.tmp" "$runner" && mv "$saved.tmp" "$saved"
prune 4 "$images"/runplane-runner-"$TAG"-*.tar
rm -f "$saved.lock"
if [ "$MODE" = save ]; then echo "$saved"; else echo "$runner"; fi
