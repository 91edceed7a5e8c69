#!/usr/bin/env bash
# Runs the issue 3 actor benchmarks against castmesh and CAF 0.17 one after the
# other on this machine and prints one table: castmesh and CAF figures, the
# ratio castmesh/CAF (throughput: CAF ns per unit / castmesh ns per unit, so
# above 1 means castmesh is faster) and the target for each workload.
#
# usage: bench/actors/run_actor_bench.sh [BUILD_DIR] [BENCH ARGS...]
#   BUILD_DIR   a build configured with CASTMESH_BUILD_BENCHMARKS=ON and
#               CASTMESH_BENCH_CAF=ON (default: build/release)
#   BENCH ARGS  passed to both executables, e.g. --scale=0.1 --only=ping
set -euo pipefail

build_dir=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build_dir=$1
  shift
fi
castmesh_bin=$build_dir/bench/actors/castmesh_actor_bench
caf_bin=$build_dir/bench/actors/caf_actor_bench
for bin in "$castmesh_bin" "$caf_bin"; do
  if [[ ! -x $bin ]]; then
    echo "error: $bin not built; configure with -DCASTMESH_BUILD_BENCHMARKS=ON -DCASTMESH_BENCH_CAF=ON" \
         "(e.g. cmake --preset release -DCASTMESH_BENCH_CAF=ON) and build castmesh_actor_bench caf_actor_bench" >&2
    exit 1
  fi
done

castmesh_out=$(mktemp)
caf_out=$(mktemp)
trap 'rm -f "$castmesh_out" "$caf_out"' EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "args: ${*:-(none)}"
"$castmesh_bin" --tsv "$@" >"$castmesh_out"
"$caf_bin" --tsv "$@" >"$caf_out"

awk -F'\t' '
  FNR == NR { caf[$1] = $3; next }
  { order[++n] = $1; units[$1] = $2; cm[$1] = $3; note[$1] = $4 }
  END {
    printf "%-15s %9s | %10s %9s | %10s %9s | %8s | %-34s\n", "workload", "units",
           "castmesh", "Munits/s", "CAF", "Munits/s", "cm/CAF", "target (issue 3)"
    printf "%-15s %9s | %10s %9s | %10s %9s | %8s |\n", "", "", "ns/unit", "", "ns/unit", "", "speedup"
    for (i = 1; i <= n; ++i) {
      w = order[i]; c = cm[w]; f = caf[w]
      ratio = (f != "" && c > 0) ? sprintf("%.2fx", f / c) : "-"
      target = ""
      if (w == "ping_pong")
        target = sprintf("<=200 ns, >=3x CAF: %s", (c <= 200 && f / c >= 3) ? "met" : "MISSED")
      else if (w == "fan_in_20to1")
        target = sprintf(">=8 M/s, >=3x CAF: %s", (1e3 / c >= 8 && f / c >= 3) ? "met" : "MISSED")
      else if (w == "spawn_stop" || w == "fork_join_64")
        target = sprintf(">=3x CAF: %s", (f / c >= 3) ? "met" : "MISSED")
      else if (w == "ask_reply" && ("ping_pong" in cm))
        target = sprintf("<=2x ping_pong (%.2fx): %s", c / cm["ping_pong"],
                         (c <= 2 * cm["ping_pong"]) ? "met" : "MISSED")
      else if (w == "idle_ask" && ("idle_wake_floor" in cm))
        target = sprintf("<=25 us: %s (%.1f us above the wake floor)", (c <= 25000) ? "met" : "MISSED",
                         (c - cm["idle_wake_floor"]) / 1e3)
      else if (w == "idle_ask")
        target = sprintf("<=25 us: %s", (c <= 25000) ? "met" : "MISSED")
      else if (w == "idle_wake_floor")
        target = "two bare threads, one futex wake each way"
      printf "%-15s %9d | %10.1f %9.3f | %10s %9s | %8s | %s\n", w, units[w], c, 1e3 / c,
             (f != "" ? sprintf("%.1f", f) : "-"), (f != "" ? sprintf("%.3f", 1e3 / f) : "-"),
             ratio, target
    }
    print ""
    print "units: messages (spawn_stop: actors; idle_ask, idle_wake_floor: round trips, median). castmesh notes:"
    for (i = 1; i <= n; ++i) if (note[order[i]] != "") printf "  %s: %s\n", order[i], note[order[i]]
  }' "$caf_out" "$castmesh_out"
echo "CAF notes:"
awk -F'\t' '$4 != "" { printf "  %s: %s\n", $1, $4 }' "$caf_out"
