#!/bin/bash
# Saves the runner image of this checkout into the cache before the tests, on a private dockerd of
# its own, so the tests' node loads it in seconds instead of building it while timed tests wait.
# `make k8s` runs it beside the Kubernetes build: the image's slow parts (debootstrap, pip, dbt) wait
# on the network and the disk while the Go build keeps the CPUs busy.
#
# Nothing is started when the image of this content is saved already. The dockerd is the one
# build.sh installs (docker.io), with no bridge (builds use the host's network) and the same runc
# wrapper as the tests' node; its directory is removed at the end, also on failure.
#
# Usage: deploy/k8s-local/runner-image.sh [TAG]   (prints the saved image's path)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "runner-image: $*" >&2; }

if saved=$("$HERE/images.sh" --saved "$@"); then
    echo "$saved"
    exit 0
fi
command -v dockerd >/dev/null || { log "dockerd is missing: deploy/k8s-local/build.sh installs it"; exit 1; }

# Short: dockerd's socket paths must fit 108 bytes. The rpk- prefix is the one test clean-ups know.
dir=$(mktemp -d /tmp/rpk-img-XXXXXX)
dockerd_pid=
stop() {
    # dockerd and the containerd it started, until both are gone: a dockerd still shutting down
    # restarts its containerd, which writes under the directory again.
    [ -n "$dockerd_pid" ] && kill "$dockerd_pid" 2>/dev/null
    for _ in $(seq 300); do pgrep -f -- "$dir" >/dev/null || break; sleep 0.1; done
    pkill -KILL -f -- "$dir" 2>/dev/null && sleep 0.5
    # What dockerd mounted under its directories (its default network namespace) and left behind.
    # (No match is no mount: under pipefail a failing grep would end the clean-up here.)
    { grep -o " $dir/[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r point; do
        umount "$point" 2>/dev/null || umount -l "$point"
    done
    rm -rf "$dir"
}
trap stop EXIT
cp "$HERE/runc-wrap" "$dir/runc-wrap" && chmod 755 "$dir/runc-wrap"
host=unix://$dir/docker.sock
dockerd --host "$host" --data-root "$dir/docker" --exec-root "$dir/x" --pidfile "$dir/dockerd.pid" \
    --bridge none --iptables=false --ip-masq=false \
    --add-runtime "clamp=$dir/runc-wrap" --default-runtime clamp >"$dir/dockerd.log" 2>&1 &
dockerd_pid=$!
for _ in $(seq 600); do
    docker --host "$host" info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$dir/dockerd.log" >&2; log "dockerd exited"; exit 1; }
    sleep 0.1
done
docker --host "$host" info >/dev/null 2>&1 || { tail -20 "$dir/dockerd.log" >&2; log "dockerd not up in 60 s"; exit 1; }
t0=$SECONDS
DOCKER_HOST=$host "$HERE/images.sh" --save "$@"
log "saved in $((SECONDS - t0)) s"
