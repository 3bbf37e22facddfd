#!/usr/bin/env bash
# Debian packages the native build needs beyond a C/C++ toolchain and CMake.
# Idempotent: installs only what is missing (needs root then).
set -euo pipefail
need=()
for pkg in libxxhash-dev cmake g++; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "install-build-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
fi
echo "install-build-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
