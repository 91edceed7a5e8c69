#!/usr/bin/env bash
# C++ cross-host round trips between two network namespaces (needs root):
# host 2 runs an agent (castmesh-host) and a raw echo server, host 1 the
# controller (host to host: unaffected by other fixtures on the same /24).
#   bash bench/hosts/run_cross_host_ask.sh build/release [ROUNDS] [--tls]
# --tls: a second run with the agent, its proc and the controller on mutual
# TLS (test certificates from scripts/make-test-certs.sh), after the
# plaintext one, on the same namespaces.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:?usage: run_cross_host_ask.sh BUILD_DIR [ROUNDS] [--tls]}
ROUNDS=${2:-5000}
WITH_TLS=${3:-}
NETNS=${ROOT}/tests/testing/netns_hosts.sh
BENCH=$(realpath "${BUILD}/bench/hosts/cross_host_ask")
AGENT=$(realpath "${BUILD}/bin/castmesh-host")
bash "${NETNS}" check
PREFIX=cmb$$
PREFIX=${PREFIX:0:8}
export CASTMESH_SECRET=bench-cross-host
certs=$(mktemp -d)
trap 'bash "${NETNS}" down "${PREFIX}" > /dev/null 2>&1 || true; rm -rf "${certs}"' EXIT
bash "${NETNS}" up "${PREFIX}" 2 > /dev/null 2>&1
log=$(mktemp)

# One agent, echo server and controller run on PORT (the agent) and
# PORT+100 (the echo server, which serves one connection); "$@": the
# agent's TLS arguments.
run() {
  local port=$1
  shift
  : > "${log}"
  : > "${log}.echo"
  bash "${NETNS}" exec "${PREFIX}" 2 -- "${BENCH}" echo-server 198.18.0.12 $((port + 100)) > "${log}.echo" 2>&1 &
  bash "${NETNS}" exec "${PREFIX}" 2 -- "${AGENT}" --address "tcp://198.18.0.12:${port}" "$@" > "${log}" 2>&1 &
  for _ in $(seq 100); do grep -q listening "${log}" && grep -q up "${log}.echo" && break; sleep 0.1; done
  bash "${NETNS}" exec "${PREFIX}" 1 -- "${BENCH}" controller "tcp://198.18.0.12:${port}" \
    "198.18.0.12:$((port + 100))" "${ROUNDS}"
}

run 26600
if [[ ${WITH_TLS} == --tls ]]; then
  bash "${ROOT}/scripts/make-test-certs.sh" "${certs}" agent controller > /dev/null
  CASTMESH_BENCH_TLS_DIR=${certs} run 26601 --ca "${certs}/ca.crt" --cert "${certs}/agent.crt" --key "${certs}/agent.key"
fi
