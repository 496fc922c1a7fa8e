#!/bin/bash
# Obtains a real Kubernetes control plane and node for the tests, from Debian's packages only.
#
# Debian bookworm's `kubernetes` source package is the upstream v1.20.2 tree with vendor/; Debian's
# golang-go builds it offline. The binaries land in $RUNPLANE_K8S_CACHE/k8s-$VERSION/bin (outside
# the clone, keyed by version) and are reused when present; the 1.5 GB build cache is deleted
# after. etcd comes prebuilt from `etcd-server`, dockerd from `docker.io`.
#
# The tree is patched before it is built (the patches beside this script, named in PATCHES): its
# vendored reflect2 v1.0.1 calls the Go runtime's map iterator with the pre-1.18 signature, and under
# Debian's Go 1.19 every JSON encoding of a map (labels, annotations, patches) writes an iterator to
# a stray address, so a loaded kube-apiserver dies with "fatal error: fault" (reflect2 v1.0.2's fix).
# The cache records which patches its binaries were built with, and is rebuilt when they change.
#
# kubemark (cmd/kubemark: the hollow nodes of Kubernetes' scale tests, a real kubelet on a fake
# container runtime) comes from the same tree with --kubemark, into the same bin directory. When
# the other binaries are there already, only kubemark is built: it needs neither gen_openapi nor
# anything else of theirs.
#
# Usage: deploy/k8s-local/build.sh [--kubemark]            (idempotent; prints the bin directory)
#        deploy/k8s-local/build.sh --locate [--kubemark]   (prints the bin directory, fails when not built)
#        deploy/k8s-local/build.sh --packages              (only installs the Debian packages)
set -euo pipefail

VERSION=v1.20.2
SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE_ROOT=${RUNPLANE_K8S_CACHE:-/var/cache/runplane}
DEST=$CACHE_ROOT/k8s-$VERSION
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet pause)
HERE=$(cd "$(dirname "$0")" && pwd)
PATCHES=(reflect2-go1.18.patch)
PATCHED=$(cd "$HERE" && cat "${PATCHES[@]}" | sha256sum | cut -c1-16)
PACKAGES=(etcd-server golang-go dpkg-dev make gcc libc6-dev openssl curl iproute2 iptables
          docker.io busybox-static debootstrap)

LOCATE= KUBEMARK= PACKAGES_ONLY=
for arg in "$@"; do
    case $arg in
        --locate) LOCATE=1 ;;
        --kubemark) KUBEMARK=1 ;;
        --packages) PACKAGES_ONLY=1 ;;
        *) echo "usage: $0 [--locate] [--kubemark] [--packages]" >&2; exit 2 ;;
    esac
done

log() { echo "k8s-local: $*" >&2; }

complete() {
    for b in "${BINARIES[@]}"; do [ -x "$DEST/bin/$b" ] || return 1; done
    [ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$SOURCE_VERSION" ] \
        && [ -f "$DEST/PATCHED" ] && [ "$(cat "$DEST/PATCHED")" = "$PATCHED" ]
}

# What was asked for is there: the binaries, and kubemark when --kubemark.
wanted() {
    complete && { [ -z "$KUBEMARK" ] || [ -x "$DEST/bin/kubemark" ]; }
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    # Services are not started by the install: tests start their own daemons.
    local policy=/usr/sbin/policy-rc.d created_policy=
    if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy; chmod +x $policy; created_policy=1; fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
        || { [ -n "$created_policy" ] && rm -f $policy; return 1; }
    [ -n "$created_policy" ] && rm -f $policy
    return 0
}

build() {
    local work=$CACHE_ROOT/build-k8s-$VERSION
    rm -rf "$work"
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/bin"
    # A private apt configuration with a deb-src line made from the machine's own Debian archive.
    local uri
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
          || awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
    echo "deb-src $uri bookworm main" > "$work/apt/sources.list"
    local apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache")
    local t0=$SECONDS
    (cd "$work" && apt-get "${apt_opts[@]}" update -qq \
        && apt-get "${apt_opts[@]}" source -qq "kubernetes=$SOURCE_VERSION" >/dev/null 2>&1)
    log "source fetched and unpacked in $((SECONDS - t0)) s"
    local src=$work/kubernetes-${SOURCE_VERSION%%-*}
    [ -d "$src" ] || { log "source tree $src missing"; return 1; }
    for p in "${PATCHES[@]}"; do patch -d "$src" -p1 -s < "$HERE/$p"; done
    export GOPATH=$work/gopath GO111MODULE=off GOFLAGS= GOPROXY=off CGO_ENABLED=0 GOCACHE=$work/gocache
    mkdir -p "$GOPATH/src/k8s.io" && ln -s "$src" "$GOPATH/src/k8s.io/kubernetes"
    cd "$GOPATH/src/k8s.io/kubernetes"
    local ld="-s -w" p c commands=()
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X k8s.io/kubernetes/vendor/$p.gitVersion=$VERSION -X k8s.io/kubernetes/vendor/$p.gitMajor=1"
        ld="$ld -X k8s.io/kubernetes/vendor/$p.gitMinor=20"
    done
    if ! complete; then
        t0=$SECONDS
        make gen_openapi >"$work/gen_openapi.log" 2>&1 || { tail -20 "$work/gen_openapi.log" >&2; return 1; }
        log "gen_openapi in $((SECONDS - t0)) s"
        # The sandbox ("pause") container of every Pod, from the same source tree.
        gcc -Os -static -DVERSION=v3.2-runplane -o "$work/bin/pause" build/pause/linux/pause.c
        strip "$work/bin/pause"
        commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
    fi
    # After kubelet, kubemark reuses most of its compiled packages from the build cache.
    if [ -n "$KUBEMARK" ]; then commands+=(kubemark); fi
    for c in "${commands[@]}"; do
        t0=$SECONDS
        go build -trimpath -ldflags "$ld" -o "$work/bin/$c" "k8s.io/kubernetes/cmd/$c"
        log "built $c in $((SECONDS - t0)) s"
    done
    cd /
    if complete; then
        # Beside binaries already in use: kubemark alone, renamed into place.
        mv "$work/bin/kubemark" "$DEST/bin/.kubemark.new" && mv "$DEST/bin/.kubemark.new" "$DEST/bin/kubemark"
    else
        rm -rf "$DEST.new" && mkdir -p "$DEST.new"
        mv "$work/bin" "$DEST.new/bin"
        echo "$SOURCE_VERSION" > "$DEST.new/VERSION"
        echo "$PATCHED" > "$DEST.new/PATCHED"
        rm -rf "$DEST" && mv "$DEST.new" "$DEST"
    fi
    rm -rf "$work"
}

if [ -n "$LOCATE" ]; then
    wanted || { log "not built: run make k8s"; exit 1; }
    echo "$DEST/bin"
    exit 0
fi
mkdir -p "$CACHE_ROOT"
install_packages
[ -n "$PACKAGES_ONLY" ] && exit 0
if ! wanted; then
    exec 9>"$CACHE_ROOT/.k8s-$VERSION.lock"
    flock 9  # another build of the same version finishes first, then is reused
    if ! wanted; then
        if complete; then
            log "cold build of kubemark $VERSION from Debian's source package"
        else
            log "cold build of Kubernetes $VERSION from Debian's source package (about 8 min)"
        fi
        t_build=$SECONDS
        build
        log "cold build done in $((SECONDS - t_build)) s"
    fi
fi
echo "$DEST/bin"
