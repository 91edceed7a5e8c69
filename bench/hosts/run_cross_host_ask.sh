#!/usr/bin/env bash
# C++ cross-host round trips between two network namespaces (needs root):
# host 2 runs an agent (castmesh-host) and a raw echo server, host 1 the
# controller (host to host: unaffected by other fixtures on the same /24).   bash bench/hosts/run_cross_host_ask.sh build/release [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:?usage: run_cross_host_ask.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-5000}
NETNS=${ROOT}/tests/testing/netns_hosts.sh
BENCH=$(realpath "${BUILD}/bench/hosts/cross_host_ask")
AGENT=$(realpath "${BUILD}/bin/castmesh-host")
bash "${NETNS}" check
PREFIX=cmb$$
PREFIX=${PREFIX:0:8}
export CASTMESH_SECRET=bench-cross-host
trap 'bash "${NETNS}" down "${PREFIX}" > /dev/null 2>&1 || true' EXIT
bash "${NETNS}" up "${PREFIX}" 2 > /dev/null 2>&1
log=$(mktemp)
bash "${NETNS}" exec "${PREFIX}" 2 -- "${AGENT}" --address tcp://198.18.0.12:26600 > "${log}" 2>&1 &
bash "${NETNS}" exec "${PREFIX}" 2 -- "${BENCH}" echo-server 198.18.0.12 26700 > "${log}.echo" 2>&1 &
for _ in $(seq 100); do grep -q listening "${log}" && grep -q up "${log}.echo" && break; sleep 0.1; done
bash "${NETNS}" exec "${PREFIX}" 1 -- "${BENCH}" controller tcp://198.18.0.12:26600 198.18.0.12:26700 "${ROUNDS}"
