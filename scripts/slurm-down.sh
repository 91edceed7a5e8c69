#!/usr/bin/env bash
# slurm-down.sh - stop the Slurm cluster of scripts/slurm-up.sh: every job,
# slurmd, slurmctld and munged of it, remove its network namespaces and its
# state dir. Idempotent; exit 0 when nothing of it is left.
#
# Usage: scripts/slurm-down.sh      (prefix: $CASTMESH_SLURM_PREFIX, default cmslurm)
# CASTMESH_SLURM_KEEP_DIR=1 keeps the state dir (slurm-up.sh's failure path,
# so its logs can be read).

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS="$HERE/../tests/testing/netns_hosts.sh"
PREFIX=${CASTMESH_SLURM_PREFIX:-cmslurm}
RUN_DIR=/run/castmesh-slurm
rc=0

D=""
[[ -r "$RUN_DIR/$PREFIX" ]] && D=$(cat "$RUN_DIR/$PREFIX")

# Kill a daemon by its pid file, only if that pid still runs the program.
stop_pidfile() {
    local file=$1 prog=$2 pid i
    [[ -r "$file" ]] || return 0
    pid=$(cat "$file" 2>/dev/null) || return 0
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    grep -qa "$prog" "/proc/$pid/cmdline" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 30; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

if [[ -n "$D" && -d "$D" ]]; then
    # Namespaces first: that kills every slurmd, slurmstepd and job task.
    bash "$NETNS" down "$PREFIX" || rc=1
    stop_pidfile "$D/ctld/slurmctld.pid" slurmctld
    stop_pidfile "$D/munge/munged.pid" munged
    if [[ "${CASTMESH_SLURM_KEEP_DIR:-0}" != 1 ]]; then
        rm -rf -- "$D"
    fi
else
    bash "$NETNS" down "$PREFIX" || rc=1
fi
rm -f "$RUN_DIR/$PREFIX"
exit $rc
