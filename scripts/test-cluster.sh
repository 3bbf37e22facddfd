#!/usr/bin/env bash
# A real multi-node Slurm on this one machine, for testing multi-node npusnap (issue #17).
#
# usage: scripts/test-cluster.sh up|down|status
#   up      start it (idempotent: what already runs is kept) and print `export` lines for a shell:
#           eval "$(scripts/test-cluster.sh up)"
#           SLURM_CONF (all that sbatch, srun, squeue, scontrol need), NPUSNAP_TEST_NODES="node1
#           node2", NPUSNAP_TEST_SHARED (the shared directory), NPUSNAP_TEST_CLUSTER_DIR,
#           NPUSNAP_TEST_HOST_ADDR (this host's address on the cluster network) and
#           NPUSNAP_TEST_NODE_ADDRS="node1=ADDR node2=ADDR"
#   down    stop it; leaves no process, network namespace, link or mount behind (logs/ stays)
#   status  say what runs; exit 0 all up, 1 partly up, 3 nothing up
# exit codes: 0 ok, 1 partly up (status) or a start failed (one line on stderr), 2 usage,
#             3 not up (status), 4 a problem with the environment (not root, state dir untrusted,
#             a tool or the package missing, the address range taken)
#
# Settings (environment):
#   NPUSNAP_CLUSTER_NAME   cluster name, <= 8 of [a-z0-9] (default npc); names the namespaces
#                          (NAME-ctl, NAME-node1, ...), the bridge NAME-br and the veths
#   NPUSNAP_CLUSTER_DIR    state directory (default /run/npusnap-cluster/NAME): root-owned,
#                          writable by nobody else, never a link
#   NPUSNAP_CLUSTER_NET    the first three octets of a private /24 (default 10.213.0): .1 is this
#                          host on the bridge, .2 slurmctld, .11, .12, ... the nodes
#   NPUSNAP_CLUSTER_NODES  number of nodes (default 2)
#   NPUSNAP                the npusnap command that starts each node's npusim daemon
#                          (default: the checkout's .venv/bin/npusnap)
#
# Shape and why:
#   * Each slurmd "node" runs in its own network namespace (NAME-nodeK, address NET.1K on a veth
#     to the bridge NAME-br) and its own UTS namespace (hostname nodeK), so a task sees its node's
#     name and address as on a real cluster. Debian's Slurm is built with multiple-slurmd
#     support (`scontrol show config`: MULTIPLE_SLURMD = Yes), but those slurmds share one
#     address and hostname, and a job restored on another node must find itself at another
#     address (communicators re-formed there), so namespaces it is. They get no default route: no
#     packet leaves the machine. Mounts stay shared (nsenter --net, not `ip netns exec`, which
#     would remount /sys in a private mount namespace), so every node sees the same files: the
#     shared checkpoint directory DIR/shared stands for a cluster file system.
#   * slurmctld and munged run in NAME-ctl (hostname ctl, address NET.2); this host reaches the
#     nodes and the controller through the bridge address NET.1, so sbatch/srun/squeue/scontrol
#     work here with SLURM_CONF alone. munged has its own key and socket under DIR/munge
#     (AuthInfo=socket=...), never touching /etc/munge or /run/munge.
#   * Each node has its own npusim daemon (`npusnap device start`, in the node's namespace) on
#     DIR/nodes/nodeK/npusim/daemon.sock with its own devices. TaskProlog exports NPUSIM_SOCKET
#     for every task, the batch script included, so `npusnap` in a job step finds its node's
#     daemon with no setup of its own (the submitter's NPUSIM_SOCKET is overridden). The daemon
#     takes HCCL traffic on the node's address (--hccl-listen), so ranks on different nodes talk
#     over the cluster network, and a communicator re-formed on other nodes moves to their addresses.
#   * slurm.conf: select/cons_tres with CR_CPU_Memory; each node claims CPUs=2 RealMemory=1024
#     (what this 2-core machine has; every node shares the same cores), DefMemPerCPU=128 so a
#     job without --mem fits. proctrack/linuxproc and task/none: no cgroups, no systemd.
#     JobRequeue=1 (batch jobs can be requeued, `scontrol requeue` works and SLURM_RESTART_COUNT
#     counts), no SlurmctldParameters needed for `--signal=B:USR1@N` or `srun --overlap` in
#     22.05. sched/builtin starts a job the moment it fits; KillWait=2 so scancel is quick;
#     AuthInfo cred_expire=5 because a requeued job waits that long before it may start again
#     (Slurm's default 120 s would make every requeue test wait two minutes).
#     FirstJobId=B*10000+1 (NET 10.A.B): two clusters on this machine never hand out the same job id.
#     Accounting off (no slurmdbd). Everything runs as root (SlurmUser=root).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin  # munged, slurmctld, slurmd, ip live there

die() { local code=$1; shift; echo "test-cluster: $*" >&2; exit "$code"; }
log() { echo "test-cluster: $*" >&2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
name=${NPUSNAP_CLUSTER_NAME:-npc}
[[ $name =~ ^[a-z0-9]{1,8}$ ]] || die 2 "NPUSNAP_CLUSTER_NAME must be 1-8 of [a-z0-9], not '$name'"
dir=${NPUSNAP_CLUSTER_DIR:-/run/npusnap-cluster/$name}
[[ $dir = /* ]] || die 2 "NPUSNAP_CLUSTER_DIR must be an absolute path, not '$dir'"
net=${NPUSNAP_CLUSTER_NET:-10.213.0}
[[ $net =~ ^10\.([0-9]{1,3})\.([0-9]{1,3})$ && ${BASH_REMATCH[1]} -le 255 && ${BASH_REMATCH[2]} -le 255 ]] ||
    die 2 "NPUSNAP_CLUSTER_NET must be 10.A.B (a private /24), not '$net'"
count=${NPUSNAP_CLUSTER_NODES:-2}
[[ $count =~ ^[1-9]$ ]] || die 2 "NPUSNAP_CLUSTER_NODES must be 1-9, not '$count'"
npusnap=${NPUSNAP:-$repo/.venv/bin/npusnap}

nodes=()
for ((i = 1; i <= count; i++)); do nodes+=("node$i"); done
bridge=$name-br
ctl_ns=$name-ctl
host_addr=$net.1
ctl_addr=$net.2
node_addr() { echo "$net.$((10 + ${1#node}))"; }
# Job ids of their own per cluster (by the /24's last octet): two clusters on one machine share
# /proc and /run/npusnap/jobs, and a job 1 on node1 of each would look like one job to npusnap.
first_job_id=$(( ${net##*.} * 10000 + 1 ))
node_ns() { echo "$name-$1"; }
conf=$dir/etc/slurm.conf
munge_sock=$dir/munge/munge.socket

# --- helpers -------------------------------------------------------------------------------------

# A directory of ours: created 0755 root-owned, or an existing one that is a real directory owned
# by root and writable by nobody else (what trust.h asks of npusim's socket directory, too).
own_dir() {
    local d=$1 mode=${2:-755}
    if [ ! -e "$d" ] && [ ! -L "$d" ]; then
        mkdir -p -m "$mode" "$d"
    fi
    [ -d "$d" ] && [ ! -L "$d" ] || die 4 "$d is not a directory (a link?): remove it"
    local owner perms
    read -r owner perms < <(stat -c '%u %a' "$d")
    [ "$owner" = 0 ] || die 4 "$d belongs to uid $owner, not root: remove it"
    (( (8#$perms & 8#022) == 0 )) || die 4 "$d is writable by group or others: remove it"
}

ns_exists() { [ -e "/run/netns/$1" ]; }
# Run a command in namespace $1 (network only; mounts stay shared) with hostname $2.
in_node() {
    local ns=$1 host=$2; shift 2
    # 8>&- 9>&-: daemons must not inherit (and so hold) the locks of up/down.
    nsenter --net="/run/netns/$ns" -- unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$host" "$@" 8>&- 9>&-
}

pid_alive() {  # pidfile expected-comm
    local pid
    [ -f "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    # a zombie is dead (it waits for whoever reaps orphans here)
    local stat
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

wait_for() {  # seconds description command...
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.2
    done
}

slurm() { SLURM_CONF=$conf "$@"; }

# --- pieces --------------------------------------------------------------------------------------

check_env() {
    [ "$(id -u)" -eq 0 ] || die 4 "must run as root (network namespaces, Slurm's daemons)"
    local tool
    for tool in ip nsenter unshare munged mungekey slurmctld slurmd sbatch sinfo scontrol; do
        command -v "$tool" >/dev/null || die 4 "$tool missing: bash scripts/install-build-deps.sh cluster"
    done
    [ -x "$npusnap" ] || die 4 "$npusnap missing: make setup (or set NPUSNAP)"
}

check_net_free() {  # the /24 must not be in use by anything but our own bridge
    local dev
    dev=$(ip -4 -o addr show | awk -v p="$net." 'index($4, p) == 1 {print $2}' | sort -u)
    if [ -n "$dev" ] && [ "$dev" != "$bridge" ]; then
        die 4 "$net.0/24 is already used by $dev: pick another with NPUSNAP_CLUSTER_NET"
    fi
}

make_bridge() {
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        ip addr add "$host_addr/24" dev "$bridge"
    fi
    ip link set "$bridge" up
}

make_ns() {  # ns veth-host-side address
    local ns=$1 veth=$2 addr=$3
    ns_exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
        ip link del "$veth" 2>/dev/null || true
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$bridge" up
        ip -n "$ns" addr add "$addr/24" dev eth0
    fi
    ip -n "$ns" link set eth0 up
}

write_config() {
    own_dir "$dir/etc"
    local tmp=$conf.tmp node
    {
        echo "# written by scripts/test-cluster.sh (its header says why each setting); do not edit"
        echo "ClusterName=$name"
        echo "SlurmctldHost=ctl($ctl_addr)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$munge_sock,cred_expire=5"
        echo "StateSaveLocation=$dir/ctld"
        echo "SlurmctldPidFile=$dir/ctld/slurmctld.pid"
        echo "SlurmctldLogFile=$dir/logs/slurmctld.log"
        echo "SlurmdSpoolDir=$dir/nodes/%n/spool"
        echo "SlurmdPidFile=$dir/nodes/%n/slurmd.pid"
        echo "SlurmdLogFile=$dir/logs/slurmd-%n.log"
        echo "PlugStackConfig=$dir/etc/plugstack.conf"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "TaskProlog=$dir/etc/task-prolog.sh"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU_Memory"
        echo "DefMemPerCPU=128"
        echo "SchedulerType=sched/builtin"
        echo "SchedulerParameters=sched_interval=1"
        echo "JobRequeue=1"
        echo "FirstJobId=$first_job_id"
        echo "ReturnToService=2"
        echo "KillWait=2"
        echo "InactiveLimit=0"
        echo "MinJobAge=300"
        echo "MessageTimeout=10"
        echo "SlurmdTimeout=60"
        echo "MpiDefault=none"
        echo "SwitchType=switch/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        for node in "${nodes[@]}"; do
            echo "NodeName=$node NodeAddr=$(node_addr "$node") NodeHostname=$node CPUs=2 RealMemory=1024 State=UNKNOWN"
        done
        echo "PartitionName=test Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
    } >"$tmp"
    chmod 644 "$tmp"
    mv -f "$tmp" "$conf"
    : >"$dir/etc/plugstack.conf"
    # Every task (the batch script too) gets its own node's npusim daemon.
    cat >"$dir/etc/task-prolog.sh.tmp" <<EOF
#!/bin/sh
# TaskProlog (scripts/test-cluster.sh): each node's tasks use that node's npusim daemon.
echo "export NPUSIM_SOCKET=$dir/nodes/\$SLURMD_NODENAME/npusim/daemon.sock"
EOF
    chmod 755 "$dir/etc/task-prolog.sh.tmp"
    mv -f "$dir/etc/task-prolog.sh.tmp" "$dir/etc/task-prolog.sh"
}

start_munge() {
    own_dir "$dir/munge" 700
    if [ ! -s "$dir/munge/munge.key" ]; then
        mungekey --create --keyfile="$dir/munge/munge.key.tmp" --force
        mv -f "$dir/munge/munge.key.tmp" "$dir/munge/munge.key"
    fi
    chmod 600 "$dir/munge/munge.key"
    pid_alive "$dir/munge/munged.pid" munged && return 0
    # --force: munged would refuse a socket directory that is not its default one.
    in_node "$ctl_ns" ctl munged --force --origin="$ctl_addr" --socket="$munge_sock" \
        --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/logs/munged.log" \
        --seed-file="$dir/munge/munged.seed" ||
        die 1 "munged did not start: see $dir/logs/munged.log"
    # The socket directory is 0700 root: only root's commands (all of ours) reach munged.
}

start_slurmctld() {
    own_dir "$dir/ctld" 700
    pid_alive "$dir/ctld/slurmctld.pid" slurmctld && return 0
    in_node "$ctl_ns" ctl env SLURM_CONF="$conf" slurmctld -f "$conf" ||
        die 1 "slurmctld did not start: see $dir/logs/slurmctld.log"
    wait_for 30 slurmctld slurm scontrol ping ||
        die 1 "slurmctld does not answer: see $dir/logs/slurmctld.log"
}

start_node() {
    local node=$1 ns
    ns=$(node_ns "$node")
    own_dir "$dir/nodes/$node"
    own_dir "$dir/nodes/$node/spool"
    own_dir "$dir/nodes/$node/npusim"
    in_node "$ns" "$node" "$npusnap" device start --socket "$dir/nodes/$node/npusim/daemon.sock" \
        --devices 2 --memory 256M --hccl-listen "$(node_addr "$node")" >>"$dir/logs/npusim-$node.log" 2>&1 ||
        die 1 "the npusim daemon of $node did not start: see $dir/logs/npusim-$node.log and $dir/nodes/$node/npusim/daemon.log"
    pid_alive "$dir/nodes/$node/slurmd.pid" slurmd && return 0
    in_node "$ns" "$node" env SLURM_CONF="$conf" slurmd -f "$conf" -N "$node" ||
        die 1 "slurmd of $node did not start: see $dir/logs/slurmd-$node.log"
}

nodes_ready() {  # every node idle, allocated or mixed, none down or unknown
    local states
    states=$(slurm sinfo -h -N -o '%T' 2>/dev/null) || return 1
    [ "$(grep -cE '^(idle|allocated|mixed|completing)$' <<<"$states")" -eq "$count" ]
}

print_exports() {
    echo "export SLURM_CONF=$conf"
    echo "export NPUSNAP_TEST_NODES=\"${nodes[*]}\""
    echo "export NPUSNAP_TEST_SHARED=$dir/shared"
    echo "export NPUSNAP_TEST_CLUSTER_DIR=$dir"
    # This host as the nodes see it (a coordinator started outside the job listens here), and
    # each node's own address.
    echo "export NPUSNAP_TEST_HOST_ADDR=$host_addr"
    local node addrs=()
    for node in "${nodes[@]}"; do addrs+=("$node=$(node_addr "$node")"); done
    echo "export NPUSNAP_TEST_NODE_ADDRS=\"${addrs[*]}\""
}

# --- commands ------------------------------------------------------------------------------------

up() {
    check_env
    own_dir "$(dirname "$dir")"
    own_dir "$dir"
    exec 9>"$dir/.lock"
    flock -w 120 9 || die 1 "another test-cluster.sh holds $dir/.lock"
    own_dir "$dir/logs"
    own_dir "$dir/shared"
    # Two clusters (two test sessions) must not take the same /24: check and claim it under one
    # lock for all of them.
    own_dir /run/npusnap-cluster
    exec 8>/run/npusnap-cluster/.net.lock
    flock -w 120 8 || die 1 "another test-cluster.sh holds /run/npusnap-cluster/.net.lock"
    check_net_free
    make_bridge
    exec 8>&-
    write_config
    make_ns "$ctl_ns" "$name-vc" "$ctl_addr"
    local node
    for node in "${nodes[@]}"; do
        make_ns "$(node_ns "$node")" "$name-v${node#node}" "$(node_addr "$node")"
    done
    start_munge
    start_slurmctld
    for node in "${nodes[@]}"; do start_node "$node"; done
    # A node registered down (an earlier slurmd killed hard) comes back once its slurmd answers.
    for node in "${nodes[@]}"; do
        if slurm sinfo -h -n "$node" -o '%T' 2>/dev/null | grep -qE '^(down|drained|draining)'; then
            slurm scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
        fi
    done
    wait_for 60 nodes nodes_ready ||
        die 1 "nodes not ready: $(slurm sinfo -h -N -o '%N=%T' 2>&1 | tr '\n' ' ')(see $dir/logs/)"
    print_exports
}

# Every process in a namespace: TERM, then KILL after 10 s.
kill_ns() {
    local ns=$1 pids
    ns_exists "$ns" || return 0
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    local end=$((SECONDS + 10))
    while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    end=$((SECONDS + 5))
    while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ $SECONDS -lt $end ]; do sleep 0.1; done
}

down() {
    [ "$(id -u)" -eq 0 ] || die 4 "must run as root"
    if [ -d "$dir" ] && [ ! -L "$dir" ]; then
        exec 9>"$dir/.lock"
        flock -w 120 9 || die 1 "another test-cluster.sh holds $dir/.lock"
    fi
    local node ns
    # Jobs first (their steps and the npusim daemons live in the nodes' namespaces), then the
    # controller's namespace (slurmctld, munged), so nothing is left to restart anything.
    for node in "${nodes[@]}"; do
        ns=$(node_ns "$node")
        if ns_exists "$ns" && [ -S "$dir/nodes/$node/npusim/daemon.sock" ] && [ -x "$npusnap" ]; then
            "$npusnap" device stop --socket "$dir/nodes/$node/npusim/daemon.sock" >/dev/null 2>&1 || true
        fi
        kill_ns "$ns"
    done
    kill_ns "$ctl_ns"
    for node in "${nodes[@]}"; do
        ns=$(node_ns "$node")
        ns_exists "$ns" && ip netns del "$ns"
        ip link del "$name-v${node#node}" 2>/dev/null || true
    done
    ns_exists "$ctl_ns" && ip netns del "$ctl_ns"
    ip link del "$name-vc" 2>/dev/null || true
    ip link del "$bridge" 2>/dev/null || true
    # Runtime state goes; the logs stay for whoever looks at a failure.
    if [ -d "$dir" ] && [ ! -L "$dir" ]; then
        find "$dir" -mindepth 1 -maxdepth 1 ! -name logs ! -name .lock -exec rm -rf {} +
    fi
    [ -d "$dir/logs" ] && log "down ($dir/logs kept)" || log "down"
}

status() {
    local up=0 total=0 node ns what
    report() {  # description ok?
        total=$((total + 1))
        if [ "$2" = 1 ]; then up=$((up + 1)); echo "up    $1"; else echo "down  $1"; fi
    }
    ok() { "$@" >/dev/null 2>&1 && echo 1 || echo 0; }
    report "bridge $bridge" "$(ok ip link show "$bridge")"
    report "namespace $ctl_ns" "$(ok ns_exists "$ctl_ns")"
    report "munged" "$(ok pid_alive "$dir/munge/munged.pid" munged)"
    report "slurmctld ($ctl_addr)" "$(ok pid_alive "$dir/ctld/slurmctld.pid" slurmctld)"
    for node in "${nodes[@]}"; do
        ns=$(node_ns "$node")
        report "namespace $ns" "$(ok ns_exists "$ns")"
        report "slurmd $node ($(node_addr "$node"))" "$(ok pid_alive "$dir/nodes/$node/slurmd.pid" slurmd)"
        what="npusim daemon $node ($dir/nodes/$node/npusim/daemon.sock)"
        report "$what" "$(ok test -S "$dir/nodes/$node/npusim/daemon.sock" -a -x "$npusnap" -a -n "$(
            "$npusnap" device status --socket "$dir/nodes/$node/npusim/daemon.sock" 2>/dev/null)")"
    done
    [ "$up" -eq "$total" ] && return 0
    [ "$up" -eq 0 ] && return 3
    return 1
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die 2 "usage: $0 up|down|status" ;;
esac
