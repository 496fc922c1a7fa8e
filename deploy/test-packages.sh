#!/usr/bin/env bash
# Debian packages the tests drive, installed when missing: chromium (the web pages in a real
# browser, through Playwright; Playwright's own browser download is not used) and prometheus (for
# promtool, which checks and unit-tests the chart's alert rules). Their services are not started.
set -euo pipefail

PACKAGES=(chromium prometheus)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "test-packages: installing ${missing[*]}" >&2
policy=/usr/sbin/policy-rc.d
created_policy=
if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy; chmod +x $policy; created_policy=1; fi
trap '[ -n "$created_policy" ] && rm -f $policy' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
