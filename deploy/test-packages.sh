#!/usr/bin/env bash
# Debian packages the tests drive, installed when missing: chromium (the web pages in a real
# browser, through Playwright; Playwright's own browser download is not used) and prometheus (for
# promtool, which checks and unit-tests the chart's alert rules), and what fences a local run
# (nftables, bubblewrap: deploy/fence-packages.sh). Their services are not started.
# Then axe-core (the accessibility checks the browser tests inject into each page) from the npm
# registry, at the version and hash of tests/system/axe/package-lock.json, into that folder only.
set -euo pipefail

AXE=$(cd "$(dirname "$0")/.." && pwd)/tests/system/axe
PACKAGES=(chromium prometheus nftables bubblewrap)
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "test-packages: installing ${missing[*]}" >&2
    policy=/usr/sbin/policy-rc.d
    created_policy=
    if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy; chmod +x $policy; created_policy=1; fi
    trap '[ -n "$created_policy" ] && rm -f $policy' EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm ci installs exactly the lock file (integrity checked); the copy of the lock it was run with
# says it need not run again.
if ! cmp -s "$AXE/package-lock.json" "$AXE/node_modules/.installed-lock.json"; then
    npm ci --prefix "$AXE" --ignore-scripts --no-audit --no-fund --loglevel=error
    cp "$AXE/package-lock.json" "$AXE/node_modules/.installed-lock.json"
fi
