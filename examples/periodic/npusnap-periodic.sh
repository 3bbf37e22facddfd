#!/bin/bash
# npusnap-periodic.sh: one periodic checkpoint of a running job, keeping the newest N.
#
#   npusnap-periodic.sh --name NAME [--pidfile FILE | --pid PID] [--dir ROOT] [--keep N]
#                       [--lock-timeout SECONDS]
#
# Checkpoints the job's process (and its children) with --leave-running into
# ROOT/NAME/<UTC time>, then `npusnap prune ROOT/NAME --keep N`. The checkpoint is
# incremental (--parent: only the device memory changed since the newest valid
# checkpoint of the same pid) unless that chain already holds FULL_EVERY checkpoints or
# the parent cannot serve (exit 8 or 11: then a full one is taken). prune keeps every
# checkpoint a kept one references, so KEEP counts chain heads' links too. The job keeps going;
# a checkpoint pauses it for the lock + backup + dump (see `npusnap inspect` for each
# phase's time). npusnap commits a checkpoint atomically (.TIME.partial-* renamed into
# place), and prune runs only after a commit, so the last good checkpoint is never
# deleted before a newer one exists. Invalid checkpoints are never pruned.
#
# Run by npusnap-checkpoint@NAME.service (its timer) or cron; see README.md here.
# Defaults (also settable in the environment, e.g. systemd's EnvironmentFile):
#   PIDFILE=/run/npusnap/NAME.pid  CKPT_ROOT=/var/lib/npusnap/checkpoints  KEEP=3
#   LOCK_TIMEOUT=60  NPUSNAP=npusnap  FULL_EVERY=10 (1: every checkpoint full)
#
# stdout: the checkpoint's JSON document (docs/json.md, kind "checkpoint"); messages,
# and prune's report, go to stderr.
#
# Exit codes: npusnap's (README table): 0 checkpointed and pruned; 4 the job is not
# running; 10 the device lock timed out (the job runs on, unlocked; the next run
# retries); 12 storage (no space: the older checkpoints are all still there); 75 an
# earlier run for NAME is still going (this one did nothing); 2 bad arguments.

set -u

name=
pid=
pidfile=${PIDFILE:-}
root=${CKPT_ROOT:-/var/lib/npusnap/checkpoints}
keep=${KEEP:-3}
lock_timeout=${LOCK_TIMEOUT:-60}
npusnap=${NPUSNAP:-npusnap}
full_every=${FULL_EVERY:-10}

say() { printf 'npusnap-periodic[%s]: %s\n' "${name:-?}" "$*" >&2; }
usage() { sed -n '4,5p' "$0" | sed 's/^# *//' >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --name) name=${2:-}; shift 2 ;;
        --pid) pid=${2:-}; shift 2 ;;
        --pidfile) pidfile=${2:-}; shift 2 ;;
        --dir) root=${2:-}; shift 2 ;;
        --keep) keep=${2:-}; shift 2 ;;
        --lock-timeout) lock_timeout=${2:-}; shift 2 ;;
        -h|--help) usage ;;
        *) say "unknown argument: $1"; usage ;;
    esac
done
[ -n "$name" ] || { say "--name is required"; usage; }
case $name in */*|.*) say "--name must be a plain name"; exit 2 ;; esac
case $keep in ''|*[!0-9]*|0) say "--keep must be a number >= 1 (the checkpoint just made counts)"; exit 2 ;; esac
case $full_every in ''|*[!0-9]*|0) say "FULL_EVERY must be a number >= 1"; exit 2 ;; esac

if [ -z "$pid" ]; then
    pidfile=${pidfile:-/run/npusnap/$name.pid}
    if ! pid=$(head -n 1 -- "$pidfile" 2>/dev/null) || [ -z "$pid" ]; then
        say "no pid in $pidfile: is the job running?"
        exit 4
    fi
fi
case $pid in *[!0-9]*|'') say "not a pid: $pid"; exit 2 ;; esac

dir=$root/$name
mkdir -p -m 0700 -- "$dir" || exit 12

# One run per job at a time (a slow checkpoint must not overlap the next timer tick
# or a manual run): an exclusive lock on the job's checkpoint directory itself.
exec 9<"$dir"
if ! flock -n 9; then
    say "an earlier checkpoint of $name is still running; skipping this one"
    exit 75
fi

# The parent: the newest valid checkpoint of this pid, if its chain is shorter than FULL_EVERY.
parent=$("$npusnap" list "$dir" --json 2>/dev/null | python3 -c '
import json, sys
pid, full_every = int(sys.argv[1]), int(sys.argv[2])
entries = json.load(sys.stdin)["checkpoints"]  # newest first
by_path = {e["path"]: e for e in entries}
mine = [e for e in entries if e["state"] == "valid" and e["pid"] == pid]
if mine:
    links, e = 1, mine[0]
    while e is not None and e.get("parent"):
        e, links = by_path.get(e["parent"]), links + 1
    if e is not None and links < full_every:
        print(mine[0]["path"])
' "$pid" "$full_every" 2>/dev/null)

stamp=$(date -u +%Y%m%dT%H%M%S.%NZ)
checkpoint() { "$npusnap" checkpoint "$pid" -D "$dir/$stamp" --leave-running --lock-timeout "$lock_timeout" --json "$@"; }
if [ -n "$parent" ]; then
    checkpoint --parent "$parent"
    rc=$?
    if [ "$rc" -eq 8 ] || [ "$rc" -eq 11 ]; then
        say "$parent cannot be the parent (npusnap exit $rc): taking a full checkpoint"
        checkpoint
        rc=$?
    fi
else
    checkpoint
    rc=$?
fi
case $rc in
    0)  say "checkpoint $dir/$stamp committed; pid $pid runs on" ;;
    4)  say "pid $pid is not running (nothing to checkpoint)"; exit 4 ;;
    10) say "the device lock timed out: pid $pid runs on, unlocked; the next run retries" ;;
    12) say "storage problem (see above); the existing checkpoints are untouched" ;;
    *)  say "checkpoint failed (npusnap exit $rc, see above)" ;;
esac
if [ "$rc" -ne 0 ]; then
    # npusnap rolls every failure back; if the process still is not RUNNING, recover it.
    state=$("$npusnap" status "$pid" --json 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin).get("state", ""))' 2>/dev/null)
    if [ -n "$state" ] && [ "$state" != RUNNING ]; then
        say "pid $pid is $state: npusnap recover"
        "$npusnap" recover "$pid" >&2
    fi
    exit "$rc"
fi

"$npusnap" prune "$dir" --keep "$keep" >&2
rc=$?
[ "$rc" -eq 0 ] || say "prune failed (npusnap exit $rc); the new checkpoint is committed"
exit "$rc"
