#!/usr/bin/env bash
# slurm-up.sh - a real, private Slurm cluster on this machine for castmesh's
# job tests and benchmarks (docs/jobs.md, "Real Slurm for tests").
#
# Usage:
#   scripts/slurm-up.sh [N]      start munged, slurmctld and N slurmd nodes (default 3)
#   scripts/slurm-down.sh        stop everything and remove the namespaces
#
# What it builds (everything as root; Debian's slurm-wlm and munge, installed
# with apt-get when missing):
#   - N simulated hosts from tests/testing/netns_hosts.sh (prefix
#     $CASTMESH_SLURM_PREFIX, default "cmslurm"): network namespaces
#     cmslurm-h1..hN at 198.18.0.11.. on a bridge at 198.18.0.1/24;
#   - munged with a fresh key (mungekey), its socket in the state dir (a
#     pathname Unix socket, so the daemons inside the namespaces reach it too);
#   - slurmctld in one more namespace host of its own (cmslurm-h(N+1), address
#     198.18.0.(11+N)), reached from the root namespace over the bridge:
#     Slurm 22.05's slurmctld listens on the wildcard address even with
#     CommunicationParameters=NoInAddrAny, so in the root namespace it would
#     listen on every interface of the machine;
#   - one slurmd per namespace (`slurmd -N nodeK`, NodeAddr 198.18.0.(10+K)),
#     each with its own spool, pid and log files;
#   - partitions "debug" (default, UP) and "down" (State=DOWN: jobs there pend
#     with reason PartitionDown).
# The generated slurm.conf suits containers: proctrack/linuxproc, task/none,
# jobacct_gather/none, no cgroups, no accounting database.
#
# State lives in $CASTMESH_SLURM_DIR (default: a fresh /tmp/castmesh-slurm.XXXXXX).
# On success it prints `export SLURM_CONF=...` lines and writes them to
# $CASTMESH_SLURM_DIR/env (source it to use sbatch/squeue/sinfo); the state
# dir's path is recorded in /run/castmesh-slurm/PREFIX for slurm-down.sh.
# Fails (after cleaning up) unless `sinfo` shows every node idle within 30 s.
# Exit 77: this machine cannot run it (not root, no namespaces, no packages).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS="$HERE/../tests/testing/netns_hosts.sh"
PREFIX=${CASTMESH_SLURM_PREFIX:-cmslurm}
N=${1:-3}
RUN_DIR=/run/castmesh-slurm
IDLE_DEADLINE_S=30

prog=$(basename "$0")
die() { echo "$prog: $*" >&2; exit 1; }
skip() { echo "$prog: cannot run here: $*" >&2; exit 77; }

[[ "$N" =~ ^[1-9][0-9]?$ ]] || die "invalid node count '$N': expected 1..99"
[[ $(id -u) == 0 ]] || skip "not root (slurmd, munged and network namespaces need root)"
why=$(bash "$NETNS" check) || skip "$why"

# ---- packages ---------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
    ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || skip "slurm-wlm/munge missing and no apt-get to install them"
    echo "$prog: installing slurm-wlm and munge (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >/dev/null ||
        skip "apt-get install slurm-wlm munge failed"
fi

# A previous cluster of this prefix (crashed run) would hold the ports.
bash "$HERE/slurm-down.sh" >/dev/null 2>&1 || true

D=${CASTMESH_SLURM_DIR:-$(mktemp -d /tmp/castmesh-slurm.XXXXXX)}
mkdir -p "$D" "$RUN_DIR"
chmod 700 "$D"
echo "$D" >"$RUN_DIR/$PREFIX"

# Undo everything on any failure below, leaving the logs for diagnosis.
on_exit() {
    local rc=$? f
    if ((rc != 0)); then
        echo "$prog: failed; logs under $D" >&2
        for f in "$D"/munge/munged.log "$D"/ctld/slurmctld.log "$D"/node*/slurmd.log; do
            [[ -s "$f" ]] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
        done
        CASTMESH_SLURM_KEEP_DIR=1 bash "$HERE/slurm-down.sh" >&2 || true
    fi
    exit "$rc"
}
trap on_exit EXIT

# ---- munge ------------------------------------------------------------------
mkdir -p "$D/munge"
chmod 700 "$D/munge"
if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$D/munge/munge.key" >/dev/null
else # munge < 0.5.14
    create-munge-key -f -r >/dev/null 2>&1 || dd if=/dev/urandom of="$D/munge/munge.key" bs=1 count=1024 status=none
    [[ -s "$D/munge/munge.key" ]] || cp /etc/munge/munge.key "$D/munge/munge.key"
fi
chmod 400 "$D/munge/munge.key"
MUNGE_SOCKET="$D/munge/munge.sock"
# --force: munged refuses to run as root otherwise; the key and socket are ours.
munged --force --key-file="$D/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" \
    --num-threads=2 2>>"$D/munge/munged.log"

# ---- namespaces -------------------------------------------------------------
# Hosts 1..N are the nodes, host N+1 the controller.
CTLD_K=$((N + 1))
CTLD_NAME="$PREFIX-h$CTLD_K"
CTLD_IP="198.18.0.$((10 + CTLD_K))"
bash "$NETNS" up "$PREFIX" "$CTLD_K"

# ---- slurm.conf -------------------------------------------------------------
CPUS=$(nproc)
CTLD_PORT=6817
SLURMD_PORT=6818
mkdir -p "$D/ctld" "$D/etc"
for ((k = 1; k <= N; k++)); do mkdir -p "$D/node$k/spool" "$D/node$k/tmp"; done
# With NoInAddrAny every daemon binds the address its own host name resolves
# to: a private /etc/hosts, bind-mounted in the daemons' mount namespaces
# only, maps the controller's and the nodes' names to their bridge addresses
# (as a cluster's DNS would). Job tasks inherit it from slurmd.
{
    echo "127.0.0.1 localhost"
    echo "$CTLD_IP $CTLD_NAME"
    for ((k = 1; k <= N; k++)); do echo "198.18.0.$((10 + k)) $PREFIX-h$k"; done
} >"$D/etc/hosts"

{
    cat <<EOF
# Generated by scripts/slurm-up.sh for castmesh tests; do not edit.
ClusterName=castmesh
SlurmctldHost=$CTLD_NAME($CTLD_IP)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
# Listen on the configured addresses only, never on a wildcard of the machine.
CommunicationParameters=NoInAddrAny
StateSaveLocation=$D/ctld
SlurmctldPidFile=$D/ctld/slurmctld.pid
SlurmctldLogFile=$D/ctld/slurmctld.log
SlurmdSpoolDir=$D/%n/spool
SlurmdPidFile=$D/%n/slurmd.pid
SlurmdLogFile=$D/%n/slurmd.log
TmpFS=$D/%n/tmp
# Containers: no cgroups, no accounting daemons.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
PlugStackConfig=$D/etc/plugstack.conf
# Fast tests: schedule at once, short kill grace, forget finished jobs late
# enough for a test to read their final state.
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
KillWait=2
MessageTimeout=5
SlurmdTimeout=30
SlurmctldTimeout=30
ReturnToService=2
MinJobAge=120
InactiveLimit=0
Waittime=0
SlurmctldDebug=info
SlurmdDebug=info
EOF
    for ((k = 1; k <= N; k++)); do
        echo "NodeName=node$k NodeAddr=198.18.0.$((10 + k)) NodeHostname=$PREFIX-h$k CPUs=$CPUS State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    echo "PartitionName=down Nodes=ALL MaxTime=INFINITE State=DOWN"
} >"$D/etc/slurm.conf"
: >"$D/etc/plugstack.conf"
export SLURM_CONF="$D/etc/slurm.conf"

# ---- daemons ----------------------------------------------------------------
# slurmctld: in its namespace host, with the private /etc/hosts (see above).
# -i: ignore state of an earlier run.
# shellcheck disable=SC2016 # expanded by the inner sh
bash "$NETNS" exec "$PREFIX" "$CTLD_K" -- sh -c 'mount --bind "$1" /etc/hosts && exec slurmctld -i -f "$2"' \
    sh "$D/etc/hosts" "$SLURM_CONF"
for ((k = 1; k <= N; k++)); do
    # slurmd daemonizes; the pid file is per node (%n).
    # `ip netns exec` remounts /sys in a private mount namespace, which hides
    # the machine's cgroup mounts, and slurmd 22.05 initializes its cgroup
    # plugin even with proctrack/linuxproc + task/none (fatal when
    # /sys/fs/cgroup is not a cgroup or tmpfs mount). A tmpfs there (with the
    # systemd folder cgroup/v1 looks for)
    # selects cgroup/v1, which is then never used.
    # shellcheck disable=SC2016 # expanded by the inner sh
    bash "$NETNS" exec "$PREFIX" "$k" -- sh -c '
        mount -t tmpfs -o size=64k,mode=755 castmesh-nocgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
        mount -t cgroup -o none,name=systemd castmesh-nocgroup /sys/fs/cgroup/systemd &&
        mount --bind "$3" /etc/hosts && exec slurmd -f "$1" -N "$2"' \
        sh "$SLURM_CONF" "node$k" "$D/etc/hosts"
done

# ---- wait until every node is idle -------------------------------------------
deadline=$((SECONDS + IDLE_DEADLINE_S))
while :; do
    states=$(sinfo -h -N -p debug -o '%N %T' 2>&1 || true)
    idle=$(grep -c ' idle$' <<<"$states" || true)
    ((idle == N)) && break
    if ((SECONDS >= deadline)); then
        die "not every node is idle after ${IDLE_DEADLINE_S}s (is another 198.18.0.0/24 fixture up?): sinfo says" \
            "$(tr '\n' ';' <<<"$states")"
    fi
    sleep 0.2
done

printf 'export SLURM_CONF=%q\nexport CASTMESH_SLURM_DIR=%q\nexport CASTMESH_SLURM_PREFIX=%q\n' \
    "$SLURM_CONF" "$D" "$PREFIX" >"$D/env"
trap - EXIT
cat "$D/env"
