#!/bin/sh
# Plays an MPI launcher on this machine: starts N copies of an SPMD program
# with castmesh's own rank variables (mpirun would set OMPI_COMM_WORLD_RANK,
# srun SLURM_PROCID; castmesh reads any of them) and a private rendezvous
# address and secret. Exits non-zero if any rank does.
#   sh run_spmd.sh PROGRAM [N]
set -u
program=$1
n=${2:-4}
export CASTMESH_WORLD_SIZE="$n"
# A socket file: abstract "unix:@" names exist only on Linux.
export CASTMESH_RENDEZVOUS="unix:${TMPDIR:-/tmp}/castmesh-spmd-$$.sock"
export CASTMESH_SECRET="spmd-$$-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
pids=""
rank=0
while [ "$rank" -lt "$n" ]; do
  CASTMESH_RANK=$rank "$program" &
  pids="$pids $!"
  rank=$((rank + 1))
done
status=0
for pid in $pids; do
  wait "$pid" || status=1
done
exit $status
