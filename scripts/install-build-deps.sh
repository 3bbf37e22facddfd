#!/usr/bin/env bash
# Debian packages the native build needs beyond a C/C++ toolchain and CMake, and the tools
# the tests use (iptables: CRIU's default network lock, tested for real).
# Idempotent: installs only what is missing (needs root then).
#
# usage: scripts/install-build-deps.sh [zdtm] [cluster]
#   zdtm:    also what CRIU's zdtm tests build with
#   cluster: also what scripts/test-cluster.sh runs (Slurm's daemons and clients, munge, ip,
#            nsenter/unshare); `make setup` never installs these, `make cluster-test` and .ci/run do
set -euo pipefail
pkgs=(libxxhash-dev cmake g++ iptables)
for mode in "$@"; do
    case "$mode" in
        zdtm) pkgs+=(libaio-dev libnl-route-3-dev nftables) ;;
        cluster) pkgs+=(slurm-wlm slurmctld slurmd slurm-client munge iproute2 util-linux) ;;
        *) echo "install-build-deps: unknown mode '$mode' (zdtm, cluster)" >&2; exit 2 ;;
    esac
done
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
