# shellcheck shell=bash
# npusnap-slurm.sh: checkpoint/requeue/restore logic for a Slurm batch job, as
# functions. Sourced by npusnap-job.sbatch; sourced by tests with fake SLURM_*
# variables and a fake `scontrol`. It defines functions and sets nothing else.
#
#   . npusnap-slurm.sh
#   nps_main CMD [ARG...]     # start (or restore) CMD, checkpoint + requeue on USR1
#
# What nps_main does:
#   start    SLURM_RESTART_COUNT > 0 (or NPUSNAP_RESUME=1) and `npusnap verify DIR` passes:
#              `npusnap restore DIR` (the workload continues where it was);
#            otherwise a fresh `setsid npusnap run -- CMD`. An invalid DIR is renamed
#            to DIR.invalid-TIME (kept for a person) before the fresh start.
#   USR1     `npusnap checkpoint PID -D DIR --replace --json`. npusnap writes
#            .DIR.partial-* and renames it over DIR only once complete, so the last good
#            checkpoint stays until the new one is committed. Exit 0: the workload was
#            killed after the commit -> `scontrol requeue $SLURM_JOB_ID`. Any other exit:
#            npusnap rolled back, the workload runs on unlocked (checked with
#            `npusnap status`, `npusnap recover` if not RUNNING) and the job continues.
#   end      the workload's exit code is the script's exit code.
#
# Settings (environment):
#   CKPT_DIR                   where checkpoints go (required); the job's is $CKPT_DIR/$NPUSNAP_JOB_KEY
#   NPUSNAP_JOB_KEY            default $SLURM_JOB_ID (set it to resume another job's checkpoint)
#   NPUSNAP_RESUME=1           restore a valid checkpoint even when SLURM_RESTART_COUNT is 0
#   NPUSNAP_WORK_LOG           the workload's stdout+stderr, default $CKPT_DIR/$NPUSNAP_JOB_KEY.log.
#                              A regular file at a stable path: CRIU reopens it by name on restore
#                              and refuses it if its size changed since the dump.
#   NPUSNAP_LOCK_TIMEOUT       seconds for queued device work to finish (default 60)
#   NPUSNAP_LOCK_RETRIES       extra checkpoint attempts after a lock timeout, exit 10 (default 1)
#   NPUSNAP_ON_RESTORE_FAILURE fresh (default): rename the unrestorable checkpoint to
#                              DIR.unrestorable-TIME and start fresh; fail: exit with
#                              npusnap's code, the checkpoint left in place
#   NPUSNAP                    the npusnap command (default: npusnap)
#   SCONTROL                   the scontrol command (default: scontrol)

# --- helpers -----------------------------------------------------------------------------

nps_log() {
    printf '%s npusnap-slurm[job %s]: %s\n' "$(date +%H:%M:%S)" "${SLURM_JOB_ID:-?}" "$*" >&2
}

# nps_json_field FILE KEY: a top-level field of one of npusnap's JSON documents.
nps_json_field() {
    python3 -c 'import json,sys; v = json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else v)' \
        "$1" "$2" 2>/dev/null
}

# nps_aside DIR WHY: rename DIR to DIR.WHY-TIME (never deletes it); prints the new name.
nps_aside() {
    local to
    to="$1.$2-$(date +%Y%m%dT%H%M%S)"
    mv -T -- "$1" "$to" && printf '%s\n' "$to"
}

# nps_wait PID: wait for child PID; a USR1 (the trap sets NPS_PENDING) interrupts.
#   returns 0 with NPS_RC = the child's exit status once it has exited;
#   returns 1 while NPS_PENDING is set and the child still runs (the caller checkpoints).
nps_wait() {
    local r
    if [ -z "$NPS_PENDING" ]; then
        wait "$1" 2>/dev/null   # no "Killed" notice: a checkpoint kills the workload on purpose
        NPS_RC=$?
        [ -z "$NPS_PENDING" ] && return 0
    fi
    # A USR1 came (before or during the wait): report it while the child runs.
    kill -0 "$1" 2>/dev/null && return 1
    # The child ended too. If `wait` was interrupted, its status is still there;
    # if it was not, a second wait answers 127 (no such child) and NPS_RC stands.
    wait "$1" 2>/dev/null
    r=$?
    [ "$r" -ne 127 ] && NPS_RC=$r
    return 0
}

# --- phases ------------------------------------------------------------------------------

nps_init() {
    NPUSNAP=${NPUSNAP:-npusnap}
    SCONTROL=${SCONTROL:-scontrol}
    NPS_PENDING=
    NPS_RC=0
    if [ -z "${CKPT_DIR:-}" ]; then nps_log "CKPT_DIR is not set"; return 2; fi
    NPS_KEY=${NPUSNAP_JOB_KEY:-${SLURM_JOB_ID:-}}
    if [ -z "$NPS_KEY" ]; then nps_log "neither SLURM_JOB_ID nor NPUSNAP_JOB_KEY is set"; return 2; fi
    mkdir -p -m 0700 -- "$CKPT_DIR" || return 12
    NPS_CKPT=$CKPT_DIR/$NPS_KEY
    NPS_LOG=${NPUSNAP_WORK_LOG:-$CKPT_DIR/$NPS_KEY.log}
    NPS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/npusnap-slurm.XXXXXX") || return 12
    NPS_PID=
    NPS_CHILD=
}

nps_cleanup() {
    [ -n "${NPS_TMP:-}" ] && rm -rf -- "$NPS_TMP"
    NPS_TMP=
}

# nps_checkpoint_valid: true when $NPS_CKPT holds a checkpoint whose checksums verify.
nps_checkpoint_valid() {
    [ -e "$NPS_CKPT" ] || return 1
    "$NPUSNAP" verify "$NPS_CKPT" --json >"$NPS_TMP/verify.json" 2>"$NPS_TMP/verify.err"
    local rc=$?
    [ "$rc" -eq 0 ] && return 0
    nps_log "checkpoint $NPS_CKPT does not verify (npusnap exit $rc): $(tail -n 1 "$NPS_TMP/verify.err")"
    return 1
}

# nps_start_fresh CMD...: the workload in its own session (CRIU dumps a process tree
# whose session it owns) with the npusnap agent preloaded; $! is the workload's pid.
nps_start_fresh() {
    if [ -s "$NPS_LOG" ]; then mv -f -- "$NPS_LOG" "$NPS_LOG.prev"; fi
    (
        # No fd of the batch shell (slurmstepd's, a test harness's pipe) may leak into
        # the workload: CRIU cannot dump a pipe or socket whose other end it does not own.
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            case $fd in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null ;; esac
        done
        exec setsid "$NPUSNAP" run -- "$@"
    ) >>"$NPS_LOG" 2>&1 </dev/null &
    NPS_PID=$!
    NPS_CHILD=$NPS_PID
    nps_log "started pid $NPS_PID: $*"
}

# nps_start_restore: `npusnap restore DIR` in the background (it waits for the restored
# workload and exits with its exit code); returns once the workload runs (pidfile
# written), or with npusnap's exit code when the restore failed.
nps_start_restore() {
    local pidfile=$NPS_TMP/restored.pid rc
    rm -f -- "$pidfile"
    # --no-verify: nps_checkpoint_valid has just recomputed every checksum.
    "$NPUSNAP" restore "$NPS_CKPT" --no-verify --pidfile "$pidfile" </dev/null &
    NPS_CHILD=$!
    while [ ! -s "$pidfile" ]; do
        if ! kill -0 "$NPS_CHILD" 2>/dev/null; then
            nps_wait "$NPS_CHILD"
            rc=$NPS_RC
            [ -s "$pidfile" ] && break     # restored, and the workload already ended
            nps_log "restore from $NPS_CKPT failed (npusnap exit $rc)"
            NPS_CHILD=
            return "$rc"
        fi
        sleep 0.1
    done
    NPS_PID=$(cat "$pidfile")
    nps_log "restored pid $NPS_PID from $NPS_CKPT (restart ${SLURM_RESTART_COUNT:-0})"
}

# nps_start CMD...: restore when this is a restart with a valid checkpoint, else start fresh.
nps_start() {
    local rc
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ "${NPUSNAP_RESUME:-0}" = 1 ]; then
        if nps_checkpoint_valid; then
            nps_start_restore && return 0
            rc=$?
            if [ "${NPUSNAP_ON_RESTORE_FAILURE:-fresh}" = fail ]; then
                nps_log "NPUSNAP_ON_RESTORE_FAILURE=fail: giving up; $NPS_CKPT is left as it is"
                return "$rc"
            fi
            nps_log "kept the checkpoint as $(nps_aside "$NPS_CKPT" unrestorable); starting fresh"
        elif [ -e "$NPS_CKPT" ]; then
            nps_log "kept the invalid checkpoint as $(nps_aside "$NPS_CKPT" invalid); starting fresh"
        else
            nps_log "restart ${SLURM_RESTART_COUNT:-0} but no checkpoint at $NPS_CKPT; starting fresh"
        fi
    fi
    nps_start_fresh "$@"
}

# nps_checkpoint: checkpoint $NPS_PID into $NPS_CKPT; returns npusnap's exit code.
nps_checkpoint() {
    local rc tries=$((${NPUSNAP_LOCK_RETRIES:-1} + 1)) json=$NPS_TMP/checkpoint.json state
    while :; do
        nps_log "checkpointing pid $NPS_PID into $NPS_CKPT"
        "$NPUSNAP" checkpoint "$NPS_PID" -D "$NPS_CKPT" --replace \
            --lock-timeout "${NPUSNAP_LOCK_TIMEOUT:-60}" --json >"$json"
        rc=$?
        tries=$((tries - 1))
        case $rc in
            0)  nps_log "checkpoint committed: $(nps_json_field "$json" bytes) bytes;" \
                        "the workload was stopped after the commit"
                return 0 ;;
            4)  nps_log "pid $NPS_PID is gone (it finished first): nothing to checkpoint"
                return 4 ;;
            10) nps_log "the device lock timed out: the workload runs on, unlocked"
                # The timed-out lock may still be inside the runtime (a retry at once is refused).
                [ "$tries" -gt 0 ] && { sleep "${NPUSNAP_LOCK_RETRY_DELAY:-5}"; continue; } ;;
            12) nps_log "storage problem (space? read-only? see above); the last good checkpoint, if any, is unchanged" ;;
            *)  nps_log "checkpoint failed (npusnap exit $rc, see the line above)" ;;
        esac
        # npusnap rolls every failure back; make sure, and recover if it could not.
        "$NPUSNAP" status "$NPS_PID" --json >"$NPS_TMP/status.json" 2>/dev/null
        state=$(nps_json_field "$NPS_TMP/status.json" state)
        if [ -n "$state" ] && [ "$state" != RUNNING ]; then
            nps_log "pid $NPS_PID is $state: npusnap recover"
            "$NPUSNAP" recover "$NPS_PID" >/dev/null
        fi
        return "$rc"
    done
}

# nps_requeue: put the job back in the queue (it is killed and restarted by Slurm).
nps_requeue() {
    if "$SCONTROL" requeue "$SLURM_JOB_ID"; then
        nps_log "requeued; the next run restores $NPS_CKPT"
        return 0
    fi
    nps_log "scontrol requeue failed; $NPS_CKPT is committed: resubmit with" \
            "--export=ALL,NPUSNAP_JOB_KEY=$NPS_KEY,NPUSNAP_RESUME=1 to continue"
    return 1
}

# nps_main CMD...: the whole job. Returns the workload's exit code (0 after a requeue).
nps_main() {
    nps_init || return
    trap 'NPS_PENDING=1' USR1
    local rc
    nps_start "$@" || { rc=$?; nps_cleanup; return "$rc"; }
    while :; do
        if nps_wait "$NPS_CHILD"; then
            nps_log "the workload ended with exit code $NPS_RC"
            nps_cleanup
            return "$NPS_RC"
        fi
        NPS_PENDING=
        nps_log "USR1: time to checkpoint"
        if nps_checkpoint; then
            # The workload was killed after the commit; reap it (or the restore that waits for it).
            while ! nps_wait "$NPS_CHILD"; do NPS_PENDING=; done
            nps_requeue
            rc=$?
            nps_cleanup
            return "$rc"
        fi
        # Not checkpointed: the workload is still running (or just finished); wait on.
    done
}
