#!/bin/bash
# Starts N ranks of train_ddp.py on this host the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK
# in each rank's environment, a fresh rendezvous directory), each under `npusnap run` so it can be
# checkpointed, each with its output in OUTDIR/rank-R.out (files, not this terminal: CRIU carries
# files). Prints the ranks' pids, then waits for them; Ctrl-C stops them all.
#
#   examples/ddp/launch.sh N [-o OUTDIR] [-- train_ddp.py options]
#   npusnap checkpoint $(cat OUTDIR/pids) -D /var/tmp/ddp-ckpt    # all ranks as one set
#   npusnap restore /var/tmp/ddp-ckpt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 N [-o OUTDIR] [-- train_ddp.py options]" >&2; exit 2; }
[ $# -ge 1 ] && [[ $1 =~ ^[1-9][0-9]*$ ]] || usage
n=$1; shift
out=""
while [ $# -gt 0 ]; do
    case $1 in
        -o) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
        --) shift; break ;;
        *) usage ;;
    esac
done
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/npusnap-ddp.XXXXXX")
mkdir -p "$out"
rendezvous=$(mktemp -d "$out/rendezvous.XXXXXX")   # fresh: a stale root info is never read
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; }
trap 'stop; exit 130' INT TERM
for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r setsid npusnap run -- python "$here/train_ddp.py" \
        --rendezvous "$rendezvous" "$@" > "$out/rank-$r.out" 2>&1 < /dev/null &
    pids+=($!)
done
printf '%s\n' "${pids[@]}" > "$out/pids"
echo "ranks ${pids[*]}; output in $out/rank-*.out"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
