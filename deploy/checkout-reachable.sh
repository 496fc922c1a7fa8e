#!/usr/bin/env bash
# Runs execute as uids of their own and read this checkout's virtual environments and code, so every
# directory down to it must let other users through (o+x). A checkout made in a private directory
# (`mktemp -d`, mode 700) is given o+x on its own root, which lists nothing; a private directory
# above it is the user's to open, and is named.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
if [ "$(id -u)" -ne 0 ]; then exit 0; fi  # not root: runs keep this uid
if [ $(( 0$(stat -c %a "$root") & 1 )) -eq 0 ]; then
	chmod o+x "$root"
	echo "checkout-reachable: gave $root o+x (runs, as uids of their own, read its virtual environments)"
fi
dir=$(dirname "$root")
while [ "$dir" != / ]; do
	if [ $(( 0$(stat -c %a "$dir") & 1 )) -eq 0 ]; then
		echo "checkout-reachable: $dir (mode $(stat -c %a "$dir")) keeps other users out, and runs execute as" \
			"uids of their own that must read $root: chmod o+x $dir, or clone runplane elsewhere" >&2
		exit 1
	fi
	dir=$(dirname "$dir")
done
