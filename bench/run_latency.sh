#!/usr/bin/env bash
# The C++ comparisons of issue 37, in one run (under 10 minutes), each the
# median of RUNS alternating runs (castmesh and its peer taking turns), with
# every run printed and the ratio against the issue's target:
#   - cross-proc 8 B round trip, Unix and TCP: handler-driven against a raw
#     socket (time ratio <= 1.15) and a plain thread's send+wait against the
#     same raw round trip (<= 1.3); also ActorRef::ask().get() to an actor in
#     a worker proc (no target; the whole runtime's plain-thread round trip);
#   - in-process fan-in 20:1 against CAF 0.17 (rate ratio >= 5);
#   - an idle plain-thread ask against a bare futex round trip measured in
#     the same run (time ratio <= 1.3).
# --cross-host adds issue 30's C++ cross-host ask (network-namespace hosts,
# needs root; bench/hosts/run_cross_host_ask.sh) against raw TCP (<= 1.3).
#
# usage: bench/run_latency.sh [BUILD_DIR] [RUNS] [--cross-host]
#   BUILD_DIR  a Release build with CASTMESH_BUILD_BENCHMARKS=ON and
#              CASTMESH_BENCH_CAF=ON (default build/release), targets
#              transport_bench castmesh_actor_bench caf_actor_bench
#              (and cross_host_ask castmesh-host for --cross-host)
#   RUNS       alternating runs per figure (default 7)
# BENCH_READ_SPIN_US (default 0; not a CASTMESH_ name, which endpoints would
# refuse as an unknown setting) sets EndpointOptions::read_spin of
# both endpoints of the handler-driven and send+wait round trips (opt-in I/O
# thread spin; docs/transport.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build/release}
RUNS=${2:-7}
CROSS_HOST=${3:-}
transport=${BUILD}/bench/transport/transport_bench
castmesh=${BUILD}/bench/actors/castmesh_actor_bench
caf=${BUILD}/bench/actors/caf_actor_bench
for bin in "${transport}" "${castmesh}" "${caf}"; do
  if [[ ! -x ${bin} ]]; then
    echo "error: ${bin} not built; cmake --preset release -DCASTMESH_BENCH_CAF=ON, then build" \
         "transport_bench castmesh_actor_bench caf_actor_bench" >&2
    exit 1
  fi
done
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
verdict() { awk -v r="$1" -v t="$2" -v dir="$3" 'BEGIN {ok = dir == "le" ? r <= t : r >= t; print ok ? "met" : "MISSED"}'; }

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %T') UTC"

echo "== cross-proc 8 B round trip (us; runs: raw castmesh)"
out=$(mktemp)
trap 'rm -f "${out}"' EXIT
"${transport}" --latency="${RUNS}" --read-spin="${BENCH_READ_SPIN_US:-0}" --ask | tee "${out}" | grep -v '^median'
echo
printf '%-5s %-17s %9s %9s %7s  %s\n' chan path raw_us cm_us ratio "target"
while IFS=$'\t' read -r _ kind what raw cm ratio; do
  case ${what} in
    handler-driven) target=1.15 ;;
    "thread send+wait") target=1.3 ;;
    *) target= ;;
  esac
  if [[ -n ${target} ]]; then
    printf '%-5s %-17s %9s %9s %7s  <= %s: %s\n' "${kind}" "${what}" "${raw}" "${cm}" "${ratio}" "${target}" \
      "$(verdict "${ratio}" "${target}" le)"
  else
    printf '%-5s %-17s %9s %9s %7s  (no target)\n' "${kind}" "${what}" "${raw}" "${cm}" "${ratio}"
  fi
done < <(grep '^median' "${out}")

echo
echo "== fan-in 20:1, ns per message (runs: castmesh CAF)"
cm_fan=()
caf_fan=()
for run in $(seq "${RUNS}"); do
  c=$("${castmesh}" --only=fan_in --tsv | awk -F'\t' '$1 == "fan_in_20to1" {print $3}')
  f=$("${caf}" --only=fan_in --tsv | awk -F'\t' '$1 == "fan_in_20to1" {print $3}')
  echo "run ${run}: ${c} ${f}"
  cm_fan+=("${c}")
  caf_fan+=("${f}")
done
c=$(printf '%s\n' "${cm_fan[@]}" | median)
f=$(printf '%s\n' "${caf_fan[@]}" | median)
ratio=$(awk -v c="${c}" -v f="${f}" 'BEGIN {printf "%.2f", f / c}')
echo "median: castmesh ${c} ns, CAF ${f} ns: rate ratio ${ratio} (target >= 5: $(verdict "${ratio}" 5 ge))"

echo
echo "== idle plain-thread ask vs a bare futex round trip, same run (us medians of 30 samples each)"
asks=()
floors=()
for run in $(seq "${RUNS}"); do
  line=$("${castmesh}" --only=idle --tsv --scale=0.3 |
    awk -F'\t' '$1 == "idle_ask" {a = $3} $1 == "idle_wake_floor" {f = $3} END {printf "%.1f %.1f", a / 1e3, f / 1e3}')
  echo "run ${run}: ${line}"
  asks+=("${line% *}")
  floors+=("${line#* }")
done
a=$(printf '%s\n' "${asks[@]}" | median)
f=$(printf '%s\n' "${floors[@]}" | median)
ratio=$(awk -v a="${a}" -v f="${f}" 'BEGIN {printf "%.2f", a / f}')
echo "median: ask ${a} us, futex floor ${f} us: time ratio ${ratio} (target <= 1.3: $(verdict "${ratio}" 1.3 le))"

if [[ ${CROSS_HOST} == --cross-host ]]; then
  echo
  echo "== cross-host ask (issue 30; network-namespace hosts, TCP)"
  ratios=()
  short_ratios=()
  for run in $(seq "${RUNS}"); do
    line=$(bash "${ROOT}/bench/hosts/run_cross_host_ask.sh" "${BUILD}" 3000 | grep '^RESULT')
    raw=$(grep -o 'raw_rtt_us=[0-9.]*' <<< "${line}" | cut -d= -f2)
    ask=$(grep -o ' ask_us=[0-9.]*' <<< "${line}" | cut -d= -f2)
    short=$(grep -o 'short_ask_us=[0-9.]*' <<< "${line}" | cut -d= -f2)
    echo "run ${run}: raw ${raw} us, ask ${ask} us, ask to a kShortHandlers echo ${short} us"
    ratios+=("$(awk -v a="${ask}" -v r="${raw}" 'BEGIN {printf "%.3f", a / r}')")
    short_ratios+=("$(awk -v a="${short}" -v r="${raw}" 'BEGIN {printf "%.3f", a / r}')")
  done
  ratio=$(printf '%s\n' "${ratios[@]}" | median)
  short_ratio=$(printf '%s\n' "${short_ratios[@]}" | median)
  echo "median ratio ${ratio} (target <= 1.3: $(verdict "${ratio}" 1.3 le))"
  echo "median ratio, kShortHandlers echo ${short_ratio} (target <= 1.3: $(verdict "${short_ratio}" 1.3 le))"
fi
