#!/usr/bin/env bash
# What fences a local run like a Pod (DESIGN.md rule 7), from Debian, installed when missing and
# when this is root: nftables (the `nft` command: a run's network) and bubblewrap (`bwrap`: its
# steps' namespaces). Without root nothing is installed and `runplane up` says what that leaves open.
set -euo pipefail

PACKAGES=(nftables bubblewrap)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "fence-packages: ${missing[*]} missing and not installed here (not root, or not Debian)" >&2
    exit 0
fi
echo "fence-packages: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
