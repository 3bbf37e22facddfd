# shellcheck shell=bash
# npusnap-slurm.sh: checkpoint/requeue/restore logic for a Slurm batch job, as
# functions. Sourced by npusnap-job.sbatch; sourced by tests with fake SLURM_*
# variables and a fake `scontrol`. It defines functions and sets nothing else.
#
#   . npusnap-slurm.sh
#   nps_main CMD [ARG...]     # start (or restore) CMD, checkpoint + requeue on USR1
#
# What nps_main does:
#   layout   the job's directory DIR=$CKPT_DIR/$NPUSNAP_JOB_KEY holds its checkpoints, one
#            directory each named by its UTC time (and, with NPUSNAP_CHECKPOINT_DEDUP=1, the
#            chunk store .npusnap-store beside them); the newest one is the job's.
#   start    SLURM_RESTART_COUNT > 0 (or NPUSNAP_RESUME=1) and `npusnap verify` passes the newest
#              checkpoint (and every link of its chain): `npusnap restore CKPT` (the workload
#              continues where it was); otherwise a fresh `setsid npusnap run -- CMD`. When the
#              newest does not verify, or cannot be restored, DIR is renamed to DIR.invalid-TIME
#              (or DIR.unrestorable-TIME), kept whole for a person, before the fresh start.
#   USR1     `npusnap checkpoint PID -D DIR/TIME --parent CKPT --json`: incremental (only the
#            device memory changed since CKPT, the checkpoint this run restored, is written; the
#            rest is referenced), or a full one after a fresh start, once the chain holds
#            NPUSNAP_FULL_EVERY checkpoints, or when CKPT cannot be the parent (exit 8, 11).
#            npusnap writes DIR/.TIME.partial-* and renames it into place only once complete, so
#            the last good checkpoint stays until the new one is committed; then
#            `npusnap prune DIR --keep NPUSNAP_KEEP` (it never deletes a link a kept one needs).
#            Exit 0: the workload was killed after the commit -> `scontrol requeue $SLURM_JOB_ID`.
#            Any other exit: npusnap rolled back, the workload runs on unlocked (checked with
#            `npusnap status`, `npusnap recover` if not RUNNING) and the job continues.
#   end      the workload's exit code is the script's exit code.
#
# Settings (environment):
#   CKPT_DIR                   where checkpoints go (required); the job's are in $CKPT_DIR/$NPUSNAP_JOB_KEY
#   NPUSNAP_JOB_KEY            default $SLURM_JOB_ID (set it to resume another job's checkpoint)
#   NPUSNAP_RESUME=1           restore a valid checkpoint even when SLURM_RESTART_COUNT is 0
#   NPUSNAP_WORK_LOG           the workload's stdout+stderr, default $CKPT_DIR/$NPUSNAP_JOB_KEY.log.
#                              A regular file at a stable path: CRIU reopens it by name on restore
#                              and refuses it if its size changed since the dump (so only the
#                              newest checkpoint, taken when the log stopped growing, restores).
#   NPUSNAP_FULL_EVERY         a full checkpoint once the chain holds this many (default 10; 1: all full)
#   NPUSNAP_KEEP               checkpoints prune keeps after each commit (default 2; their chains too)
#   NPUSNAP_LOCK_TIMEOUT       seconds for queued device work to finish (default 60)
#   NPUSNAP_LOCK_RETRIES       extra checkpoint attempts after a lock timeout, exit 10 (default 1)
#   NPUSNAP_ON_RESTORE_FAILURE fresh (default): rename the job's directory to
#                              DIR.unrestorable-TIME and start fresh; fail: exit with
#                              npusnap's code, the checkpoints left in place
#   NPUSNAP_CHECKPOINT_*       npusnap's own settings for every checkpoint (README, Configuration),
#                              e.g. NPUSNAP_CHECKPOINT_DEDUP=1 (host pages stored once across
#                              checkpoints), NPUSNAP_CHECKPOINT_COMPRESS=auto
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
    case ${NPUSNAP_FULL_EVERY:-10} in ''|*[!0-9]*|0) nps_log "NPUSNAP_FULL_EVERY must be a number >= 1"; return 2 ;; esac
    case ${NPUSNAP_KEEP:-2} in ''|*[!0-9]*|0) nps_log "NPUSNAP_KEEP must be a number >= 1"; return 2 ;; esac
    mkdir -p -m 0700 -- "$CKPT_DIR" || return 12
    NPS_DIR=$CKPT_DIR/$NPS_KEY
    NPS_CKPT=      # the job's newest checkpoint (nps_newest), then the one this run committed
    NPS_PARENT=    # the checkpoint this run restored, while its chain is shorter than NPUSNAP_FULL_EVERY
    NPS_LOG=${NPUSNAP_WORK_LOG:-$CKPT_DIR/$NPS_KEY.log}
    NPS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/npusnap-slurm.XXXXXX") || return 12
    NPS_PID=
    NPS_CHILD=
}

nps_cleanup() {
    [ -n "${NPS_TMP:-}" ] && rm -rf -- "$NPS_TMP"
    NPS_TMP=
}

# nps_newest: the newest complete checkpoint in $NPS_DIR (a checkpoint still being written, or
# whose writer died, does not count): sets NPS_CKPT and NPS_LINKS (its chain's length, itself
# included); false when there is none.
nps_newest() {
    local line
    NPS_CKPT=
    [ -d "$NPS_DIR" ] || return 1
    line=$("$NPUSNAP" list "$NPS_DIR" --json 2>"$NPS_TMP/list.err" | python3 -c '
import json, sys
entries = json.load(sys.stdin)["checkpoints"]  # newest first
by_path = {e["path"]: e for e in entries}
done = [e for e in entries if e["state"] in ("valid", "invalid")]
if done:
    links, e = 0, done[0]
    while e is not None and links < 1000:
        links += 1
        e = by_path.get(e["parent"]) if e.get("parent") else None
    print(links, done[0]["path"])
' 2>/dev/null)
    if [ -z "$line" ]; then
        [ -s "$NPS_TMP/list.err" ] && nps_log "cannot list $NPS_DIR: $(tail -n 1 "$NPS_TMP/list.err")"
        return 1
    fi
    read -r NPS_LINKS NPS_CKPT <<<"$line"
}

# nps_checkpoint_valid: true when $NPS_CKPT (and every link of its chain) verifies.
nps_checkpoint_valid() {
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
        if ! nps_newest; then
            nps_log "restart ${SLURM_RESTART_COUNT:-0} but no checkpoint in $NPS_DIR; starting fresh"
        elif nps_checkpoint_valid; then
            nps_start_restore
            rc=$?
            if [ "$rc" -eq 0 ]; then
                # Its next checkpoint writes only what changes from here (an older layout's
                # checkpoint, $NPS_DIR itself, cannot hold its children: a full one then).
                if [ "$NPS_LINKS" -lt "${NPUSNAP_FULL_EVERY:-10}" ] && [ "$NPS_CKPT" != "$NPS_DIR" ]; then
                    NPS_PARENT=$NPS_CKPT
                fi
                return 0
            fi
            if [ "${NPUSNAP_ON_RESTORE_FAILURE:-fresh}" = fail ]; then
                nps_log "NPUSNAP_ON_RESTORE_FAILURE=fail: giving up; $NPS_DIR is left as it is"
                return "$rc"
            fi
            # The whole directory: a chain's links and its chunk store are one thing.
            nps_log "kept the job's checkpoints as $(nps_aside "$NPS_DIR" unrestorable); starting fresh"
        else
            nps_log "kept the job's checkpoints as $(nps_aside "$NPS_DIR" invalid); starting fresh"
        fi
    fi
    nps_start_fresh "$@"
}

# nps_checkpoint: checkpoint $NPS_PID into $NPS_DIR/TIME (incremental against $NPS_PARENT when
# set), then prune; returns npusnap's exit code.
nps_checkpoint() {
    local rc tries=$((${NPUSNAP_LOCK_RETRIES:-1} + 1)) json=$NPS_TMP/checkpoint.json state
    local parent=$NPS_PARENT dest
    mkdir -p -m 0700 -- "$NPS_DIR" || return 12
    while :; do
        dest=$NPS_DIR/$(date -u +%Y%m%dT%H%M%S.%NZ)
        nps_log "checkpointing pid $NPS_PID into $dest${parent:+ (incremental: what changed since ${parent##*/})}"
        "$NPUSNAP" checkpoint "$NPS_PID" -D "$dest" ${parent:+--parent "$parent"} \
            --lock-timeout "${NPUSNAP_LOCK_TIMEOUT:-60}" --json >"$json"
        rc=$?
        if { [ "$rc" -eq 8 ] || [ "$rc" -eq 11 ]; } && [ -n "$parent" ]; then
            nps_log "$parent cannot be the parent (npusnap exit $rc, see above): taking a full checkpoint"
            parent=
            continue
        fi
        tries=$((tries - 1))
        case $rc in
            0)  NPS_CKPT=$dest
                nps_log "checkpoint committed: $(nps_json_field "$json" bytes) bytes written;" \
                        "the workload was stopped after the commit"
                nps_prune
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

# nps_prune: the job's newest NPUSNAP_KEEP checkpoints stay (with every link their chains need);
# a failure is reported, never fatal: the new checkpoint is committed.
nps_prune() {
    "$NPUSNAP" prune "$NPS_DIR" --keep "${NPUSNAP_KEEP:-2}" >&2 2>"$NPS_TMP/prune.err" ||
        nps_log "prune failed (npusnap exit $?): $(tail -n 1 "$NPS_TMP/prune.err"); the new checkpoint is committed"
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
