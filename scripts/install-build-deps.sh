#!/usr/bin/env bash
# Debian packages the native build needs beyond a C/C++ toolchain and CMake, and the tools
# the tests use (iptables: CRIU's default network lock, tested for real).
# Idempotent: installs only what is missing (needs root then).
#
# usage: scripts/install-build-deps.sh [zdtm]   (zdtm: also what CRIU's zdtm tests build with)
set -euo pipefail
pkgs=(libxxhash-dev cmake g++ iptables)
if [ "${1:-}" = zdtm ]; then
    pkgs+=(libaio-dev libnl-route-3-dev nftables)
fi
need=()
for pkg in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "install-build-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
fi
echo "install-build-deps: installing ${need[*]}" >&2
# Another apt run on the machine holds the lock for a while: wait for it instead of failing.
apt=(apt-get -o DPkg::Lock::Timeout=600)
"${apt[@]}" update -qq
DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
