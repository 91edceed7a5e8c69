#!/usr/bin/env bash
# Runs the collectives benchmark against castmesh and Open MPI one after the
# other, under the same mpirun settings, for each rank count, and prints one
# table per op: size, castmesh us, MPI us, their ratio (castmesh/MPI: above 1
# means castmesh is slower), the bus bandwidth of each and a memcpy floor
# measured in the same castmesh run.
#
# usage: bench/collectives/run_collectives_bench.sh [BUILD_DIR] [--ranks="2 4"] [BENCH ARGS...]
#   BUILD_DIR   a build with CASTMESH_BUILD_BENCHMARKS=ON in which CMake found
#               MPI (default: build/release)
#   --ranks     the rank counts to run, one mpirun each per program (default "2 4")
#   BENCH ARGS  passed to both programs: --quick, --max-bytes=16M, --ops=allreduce,...
# MPIRUN_ARGS in the environment adds mpirun flags (to both programs alike).
set -euo pipefail

build_dir=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build_dir=$1
  shift
fi
ranks="2 4"
bench_args=()
for arg in "$@"; do
  case $arg in
    --ranks=*) ranks=${arg#--ranks=} ;;
    *) bench_args+=("$arg") ;;
  esac
done

castmesh_bin=$build_dir/bench/collectives/castmesh_collectives_bench
mpi_bin=$build_dir/bench/collectives/mpi_collectives_bench
if ! command -v mpirun >/dev/null || ! mpirun --version 2>/dev/null | grep -q 'Open MPI'; then
  echo "error: this script runs Open MPI's mpirun; install it with: apt-get install openmpi-bin libopenmpi-dev" >&2
  exit 1
fi
for bin in "$castmesh_bin" "$mpi_bin"; do
  if [[ ! -x $bin ]]; then
    echo "error: $bin not built; configure with -DCASTMESH_BUILD_BENCHMARKS=ON where CMake finds MPI" \
         "(e.g. cmake --preset release) and build castmesh_collectives_bench mpi_collectives_bench" >&2
    exit 1
  fi
done

# The same launch for both programs: every rank on this host, not bound to a
# core (castmesh ranks have I/O threads besides the caller's; binding would
# also refuse more ranks than cores).
read -r -a extra_mpirun_args <<< "${MPIRUN_ARGS:-}"
mpirun_args=(--allow-run-as-root --oversubscribe --bind-to none "${extra_mpirun_args[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cores=$(nproc)
echo "collectives benchmark: castmesh vs Open MPI, $(date -u '+%Y-%m-%d %H:%M UTC')"
if commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null); then
  dirty=$(git -C "$(dirname "$0")" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  echo "source: main at $commit$([[ $dirty -gt 0 ]] && echo " + $dirty modified tracked files")"
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores," \
     "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mpirun: $(mpirun --version 2>/dev/null | head -1); flags: ${mpirun_args[*]} -n N"
echo "args: ${bench_args[*]:-(none)}"
echo "ratio = castmesh us / MPI us (above 1: castmesh slower); busbw as NCCL-tests (allreduce x2(n-1)/n,"
echo "allgather x(n-1)/n, size = the gathered buffer); pingpong: one-way latency (half a round trip)."

for n in $ranks; do
  oversubscribed=""
  [[ $n -gt $cores ]] && oversubscribed=" (oversubscribed: $n ranks on $cores cores)"
  echo
  echo "=============== $n ranks$oversubscribed"
  mpirun "${mpirun_args[@]}" -n "$n" "$castmesh_bin" --tsv "${bench_args[@]}" >"$work/castmesh.tsv"
  mpirun "${mpirun_args[@]}" -n "$n" "$mpi_bin" --tsv "${bench_args[@]}" >"$work/mpi.tsv"
  awk -F'\t' '
    function label(b) {
      if (b == 0) return "-"
      if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
      if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
      return b " B"
    }
    FNR == 1 { file++ }
    $1 == "info" && $2 == "setup" { setup[file] = setup[file] "  " $3 "\n" }
    $1 == "note" { notes = notes "  note (" (file == 1 ? "castmesh" : "MPI") "): " $2 "\n" }
    $1 == "row" {
      key = $2 SUBSEP $3
      if (!(key in seen)) { seen[key] = 1; order[++rows] = key; op[key] = $2; bytes[key] = $3 }
      us[file, key] = $4; bw[file, key] = $5
    }
    END {
      printf "castmesh:\n%sMPI:\n%s", setup[1], setup[2]
      titles["allreduce"] = "allreduce (float32 sum)"
      titles["broadcast"] = "broadcast (root 0)"
      titles["allgather"] = "allgather (size = gathered buffer)"
      titles["barrier"] = "barrier"
      titles["pingpong"] = "ping-pong ranks 0 <-> 1 (one-way)"
      titles["memcpy"] = "memcpy floor (one process; measured in each run: a check that both saw the same machine)"
      current = ""
      for (i = 1; i <= rows; ++i) {
        k = order[i]; o = op[k]
        if (o != current) {
          current = o
          printf "\n%s\n", titles[o]
          if (o == "memcpy")
            printf "%9s | %11s %11s | %13s %13s\n", "size", "cm-run ns", "MPI-run ns", "cm-run GB/s", "MPI-run GB/s"
          else
            printf "%9s | %11s %11s %7s | %13s %13s | %11s\n", "size", "castmesh us", "MPI us", "cm/MPI",
                   (o == "pingpong" ? "castmesh GB/s" : "cm busbw GB/s"),
                   (o == "pingpong" ? "MPI GB/s" : "MPI busbw GB/s"), "memcpy GB/s"
        }
        c = ((1, k) in us) ? us[1, k] : ""; m = ((2, k) in us) ? us[2, k] : ""
        if (o == "memcpy") {
          printf "%9s | %11s %11s | %13s %13s\n", label(bytes[k]), (c != "" ? sprintf("%.1f", c * 1e3) : "-"),
                 (m != "" ? sprintf("%.1f", m * 1e3) : "-"), (c != "" ? sprintf("%.2f", bw[1, k]) : "-"),
                 (m != "" ? sprintf("%.2f", bw[2, k]) : "-")
          continue
        }
        ratio = (c != "" && m != "" && m > 0) ? sprintf("%.2f", c / m) : "-"
        floor = ("memcpy" SUBSEP bytes[k]) in seen && (1, "memcpy" SUBSEP bytes[k]) in bw ? sprintf("%.2f", bw[1, "memcpy" SUBSEP bytes[k]]) : "-"
        if (o == "barrier") floor = "-"
        printf "%9s | %11s %11s %7s | %13s %13s | %11s\n", label(bytes[k]),
               (c != "" ? sprintf("%.2f", c) : "-"), (m != "" ? sprintf("%.2f", m) : "-"), ratio,
               (c != "" && o != "barrier" ? sprintf("%.3f", bw[1, k]) : "-"),
               (m != "" && o != "barrier" ? sprintf("%.3f", bw[2, k]) : "-"), floor
      }
      printf "%s", notes
    }' "$work/castmesh.tsv" "$work/mpi.tsv"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
