#!/usr/bin/env bash
# C++ cross-host round trips and 64 MiB transfers between two network
# namespaces (needs root): host 2 runs an agent (castmesh-host) and a raw
# echo server, host 1 the controller (host to host: unaffected by other
# fixtures on the same /24).
#   bash bench/hosts/run_cross_host_ask.sh build/release [ROUNDS] [--tls [PAIRS]]
# --tls: PAIRS (default 3) alternations of a plaintext run and a run with the
# agent, its proc and the controller on mutual TLS (test certificates from
# scripts/make-test-certs.sh), on the same namespaces, each pair followed by
# `openssl speed -evp` of the cipher the TLS run negotiated on one core (the
# crypto ceiling); then the medians over all runs against issue 38's targets,
# and the throughput the CPU time of a read allows each side on a core of its
# own (less sensitive to other load on the machine than wall time).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:?usage: run_cross_host_ask.sh BUILD_DIR [ROUNDS] [--tls [PAIRS]]}
ROUNDS=${2:-5000}
WITH_TLS=${3:-}
PAIRS=${4:-3}
NETNS=${ROOT}/tests/testing/netns_hosts.sh
BENCH=$(realpath "${BUILD}/bench/hosts/cross_host_ask")
AGENT=$(realpath "${BUILD}/bin/castmesh-host")
bash "${NETNS}" check
PREFIX=cmb$$
PREFIX=${PREFIX:0:8}
export CASTMESH_SECRET=bench-cross-host
certs=$(mktemp -d)
log=$(mktemp)
results=$(mktemp)
trap 'bash "${NETNS}" down "${PREFIX}" > /dev/null 2>&1 || true; rm -rf "${certs}" "${log}"* "${results}"' EXIT
bash "${NETNS}" up "${PREFIX}" 2 > /dev/null 2>&1

# One agent, echo server and controller run on PORT (the agent) and
# PORT+100 (the echo server, which serves one connection); "$@": the
# agent's TLS arguments. The controller's RESULT line goes to $results.
run() {
  local port=$1
  shift
  : > "${log}"
  : > "${log}.echo"
  bash "${NETNS}" exec "${PREFIX}" 2 -- "${BENCH}" echo-server 198.18.0.12 $((port + 100)) > "${log}.echo" 2>&1 &
  bash "${NETNS}" exec "${PREFIX}" 2 -- "${AGENT}" --address "tcp://198.18.0.12:${port}" "$@" > "${log}" 2>&1 &
  for _ in $(seq 100); do grep -q listening "${log}" && grep -q up "${log}.echo" && break; sleep 0.1; done
  # Debug logging names the negotiated TLS version and cipher ("TLS with ...").
  CASTMESH_LOG=${CASTMESH_BENCH_LOG:-debug} bash "${NETNS}" exec "${PREFIX}" 1 -- "${BENCH}" controller \
    "tcp://198.18.0.12:${port}" "198.18.0.12:$((port + 100))" "${ROUNDS}" 2> "${log}.controller" |
    tee -a "${results}"
  grep -m1 -o 'TLS with [^(]*([^)]*)' "${log}.controller" || true
  # The controller's shutdown ends the agent, its close the echo server.
  for _ in $(seq 100); do [[ -z $(jobs -pr) ]] && break; sleep 0.1; done
  jobs -pr | xargs -r kill 2> /dev/null || true
}

if [[ ${WITH_TLS} != --tls ]]; then
  run 26600
  exit 0
fi
bash "${ROOT}/scripts/make-test-certs.sh" "${certs}" agent controller > /dev/null
speeds=()
for pair in $(seq "${PAIRS}"); do
  echo "== pair ${pair}/${PAIRS}: plaintext"
  run $((26600 + 2 * pair))
  echo "== pair ${pair}/${PAIRS}: mutual TLS"
  CASTMESH_BENCH_TLS_DIR=${certs} run $((26601 + 2 * pair)) \
    --ca "${certs}/ca.crt" --cert "${certs}/agent.crt" --key "${certs}/agent.key"
  cipher=$(grep -m1 -o 'TLSv1.3 TLS_[A-Z0-9_]*' "${log}.controller" | awk '{print $2}')
  case ${cipher} in
    TLS_AES_256_GCM_SHA384) evp=aes-256-gcm ;;
    TLS_AES_128_GCM_SHA256) evp=aes-128-gcm ;;
    TLS_CHACHA20_POLY1305_SHA256) evp=chacha20-poly1305 ;;
    *) echo "unknown negotiated cipher '${cipher}'" >&2; exit 1 ;;
  esac
  # One core (openssl speed is single-threaded), 16 KiB: TLS's record size.
  kbps=$(openssl speed -seconds 3 -bytes 16384 -evp "${evp}" 2> /dev/null | awk 'END {print $2}')
  gbps=$(awk -v k="${kbps%k}" 'BEGIN {printf "%.2f", k * 1000 / 1e9}')
  echo "openssl speed -evp ${evp} -bytes 16384 (one core): ${gbps} GB/s"
  speeds+=("${gbps}")
done

# Medians over the pairs, and issue 38's targets.
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
field() { grep "mode=$1 " "${results}" | grep -o " $2=[0-9.]*" | cut -d= -f2; }
plain_ask=$(field plain ask_us | median)
tls_ask=$(field tls ask_us | median)
plain_rdma=$(field plain rdma_gbps | median)
tls_rdma=$(field tls rdma_gbps | median)
raw_stream=$(field plain raw_gbps | median)
plain_cpu=$(field plain cpu_bound_gbps | median)
tls_cpu=$(field tls cpu_bound_gbps | median)
cipher_speed=$(printf '%s\n' "${speeds[@]}" | median)
echo "== medians over ${PAIRS} pairs (cipher ${evp})"
awk -v pa="${plain_ask}" -v ta="${tls_ask}" -v pr="${plain_rdma}" -v tr="${tls_rdma}" -v raw="${raw_stream}" \
  -v c="${cipher_speed}" -v pc="${plain_cpu}" -v tc="${tls_cpu}" 'BEGIN {
  printf "ask round trip:   plaintext %.1f us, TLS %.1f us: %.2fx (target <= 1.2x) %s\n", pa, ta, ta / pa,
         (ta / pa <= 1.2 ? "met" : "NOT met")
  printf "64 MiB RDMA read: plaintext %.2f GB/s (raw TCP stream %.2f), TLS %.2f GB/s\n", pr, raw, tr
  printf "  TLS / plaintext %.0f%% (target >= 50%%) %s\n", 100 * tr / pr, (tr / pr >= 0.5 ? "met" : "NOT met")
  printf "  TLS / one-core cipher speed %.2f GB/s: %.0f%% (target >= 60%%) %s\n", c, 100 * tr / c,
         (tr / c >= 0.6 ? "met" : "NOT met")
  printf "  from CPU time per read (a core per side): plaintext %.2f GB/s, TLS %.2f GB/s = %.0f%% of it, %.0f%% of the cipher\n",
         pc, tc, 100 * tc / pc, 100 * tc / c
}'
