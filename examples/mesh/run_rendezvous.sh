#!/bin/sh
# Plays srun for the mesh example on this machine: starts the controller with
# a rendezvous address, then 8 worker procs (the same binary) the way
#   srun -N 2 --ntasks-per-node=4 --export=ALL,CASTMESH_RENDEZVOUS=...,CASTMESH_SECRET=... castmesh_mesh_example
# would (SLURM_PROCID / SLURM_NTASKS), in shuffled order. Exits with the
# controller's status.
#   sh examples/mesh/run_rendezvous.sh build/dev/examples/mesh/castmesh_mesh_example
set -u
exe=$1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
CASTMESH_SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export CASTMESH_SECRET

"$exe" --rendezvous tcp:127.0.0.1:0 >"$logs/controller" 2>&1 &
controller=$!
address=
for _ in $(seq 1 300); do
  address=$(sed -n 's/^rendezvous at \([^:]*:[^:]*:[0-9]*\):.*/\1/p' "$logs/controller")
  [ -n "$address" ] && break
  kill -0 "$controller" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$address" ]; then
  cat "$logs/controller"
  echo "the controller printed no rendezvous address" >&2
  exit 1
fi

for rank in 5 3 0 7 1 6 2 4; do
  CASTMESH_RENDEZVOUS=$address SLURM_PROCID=$rank SLURM_NTASKS=8 "$exe" 2>"$logs/worker$rank" &
done

wait "$controller"
status=$?
cat "$logs/controller"
wait  # the workers exit when the controller stops them (one was made to die)
exit "$status"
