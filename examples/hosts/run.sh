#!/usr/bin/env bash
# Starts three host agents and drives them from one controller script
# (examples/hosts/controller.py). As root, each agent runs in a network
# namespace of its own (a simulated machine with its own host name and an
# address in 198.18.0.0/24, tests/testing/netns_hosts.sh); otherwise all
# three listen on this machine's loopback. Needs PYTHONPATH to reach the
# castmesh package (scripts/run-example.sh sets it) or castmesh installed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "${HERE}/../.." && pwd)
PYTHON=${PYTHON:-python3}
NETNS=${ROOT}/tests/testing/netns_hosts.sh
export CASTMESH_SECRET=${CASTMESH_SECRET:-$("${PYTHON}" -c 'import secrets; print(secrets.token_hex(16))')}
PREFIX=cmex$$
PREFIX=${PREFIX:0:8}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "${pid}" 2> /dev/null || true; done
  if [ "${use_netns:-0}" = 1 ]; then bash "${NETNS}" down "${PREFIX}" > /dev/null 2>&1 || true; fi
}
trap cleanup EXIT
use_netns=0
if bash "${NETNS}" check > /dev/null 2>&1; then use_netns=1; fi

workers=()
logs=$(mktemp -d)
for k in 1 2 3; do
  if [ "${use_netns}" = 1 ]; then
    [ "${k}" = 1 ] && bash "${NETNS}" up "${PREFIX}" 3 > /dev/null
    address="tcp://198.18.0.1${k}:26600"
    bash "${NETNS}" exec "${PREFIX}" "${k}" -- "${PYTHON}" -m castmesh.host --address "${address}" > "${logs}/agent${k}" 2>&1 &
  else
    "${PYTHON}" -m castmesh.host --address tcp://127.0.0.1:0 > "${logs}/agent${k}" 2>&1 &
  fi
  pids+=($!)
done
for k in 1 2 3; do
  for _ in $(seq 100); do grep -q "listening at" "${logs}/agent${k}" && break; sleep 0.1; done
  line=$(grep "listening at" "${logs}/agent${k}") || { cat "${logs}/agent${k}"; exit 1; }
  workers+=("${line##* }")
done
echo "agents: ${workers[*]} ($([ "${use_netns}" = 1 ] && echo 'one network namespace each' || echo 'loopback'))"
"${PYTHON}" "${HERE}/controller.py" "${workers[@]}"
