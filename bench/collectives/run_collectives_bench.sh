#!/usr/bin/env bash
# Runs the collectives benchmark against castmesh and Open MPI one after the
# other, under the same mpirun settings, for each rank count, and prints one
# table per op: size, castmesh us, MPI us, their ratio (castmesh/MPI: above 1
# means castmesh is slower), the bus bandwidth of each and a memcpy floor
# measured in the same castmesh run. One sitting runs everything.
#
# usage: bench/collectives/run_collectives_bench.sh [BUILD_DIR] [--ranks="2 4"] [--tcp] [BENCH ARGS...]
#   BUILD_DIR   a build with CASTMESH_BUILD_BENCHMARKS=ON in which CMake found
#               MPI (default: build/release)
#   --ranks     the rank counts to run (default "2 4")
#   --tcp       "across hosts" on one host: both programs move every byte
#               over TCP on loopback. Open MPI: --mca btl tcp,self (no shared
#               memory, no CMA); castmesh: a tcp: rendezvous (so every rank
#               listens on TCP), CASTMESH_SHM=0 and CASTMESH_SINGLE_COPY=0
#               (no shared-memory rings, no process_vm_readv)
#   --rounds    runs of each program per rank count, castmesh and MPI
#               alternating; every figure is the median over them (default 3:
#               on a shared machine the load moves between runs)
#   BENCH ARGS  passed to both programs: --quick, --max-bytes=16M, --ops=allreduce,...
# MPIRUN_ARGS in the environment adds mpirun flags (to both programs alike).
set -euo pipefail

build_dir=build/release
if [[ $# -gt 0 && $1 != --* ]]; then
  build_dir=$1
  shift
fi
ranks="2 4"
rounds=3
tcp=0
bench_args=()
for arg in "$@"; do
  case $arg in
    --ranks=*) ranks=${arg#--ranks=} ;;
    --tcp) tcp=1 ;;
    --rounds=*) rounds=${arg#--rounds=} ;;
    *) bench_args+=("$arg") ;;
  esac
done

castmesh_bin=$build_dir/bench/collectives/castmesh_collectives_bench
mpi_bin=$build_dir/bench/collectives/mpi_collectives_bench
if ! command -v mpirun >/dev/null || ! mpirun --version 2>/dev/null | grep -q 'Open MPI'; then
  echo "error: this script runs Open MPI's mpirun; install it with: apt-get install openmpi-bin libopenmpi-dev" >&2
  exit 1
fi
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --rounds wants a positive count, not '$rounds'" >&2
  exit 2
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
castmesh_mpirun_args=()
mpi_mpirun_args=()
if [[ $tcp -eq 1 ]]; then
  mpi_mpirun_args=(--mca btl tcp,self)
  # The secret only has to be the same on every rank of one run.
  export CASTMESH_SECRET="bench-tcp-$$-$RANDOM"
  castmesh_mpirun_args=(-x CASTMESH_SHM=0 -x CASTMESH_SINGLE_COPY=0 -x CASTMESH_SECRET)
fi
# A tcp: rendezvous on a loopback port nobody listens on (a fresh one per
# castmesh run); rank 0 listens there, the others on 127.0.0.1:0.
free_port() {
  local port
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "error: no free loopback port found" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cores=$(nproc)
echo "collectives benchmark: castmesh vs Open MPI, $(date -u '+%Y-%m-%d %H:%M UTC')"
checkout="(not a git checkout)"
if commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null); then
  dirty=$(git -C "$(dirname "$0")" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  checkout="$commit"
  if [[ $dirty -gt 0 ]]; then checkout+=" + $dirty modified tracked files"; fi
fi
# The build may be of another tree than this script's checkout: both are named.
echo "build: $build_dir; this script's checkout: $checkout"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores," \
     "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mpirun: $(mpirun --version 2>/dev/null | head -1); flags: ${mpirun_args[*]} -n N"
if [[ $tcp -eq 1 ]]; then
  echo "transport: TCP on loopback for both (MPI: ${mpi_mpirun_args[*]}; castmesh: ${castmesh_mpirun_args[*]}" \
       "-x CASTMESH_RENDEZVOUS=tcp:127.0.0.1:PORT)"
fi
echo "args: ${bench_args[*]:-(none)}"
echo "ratio = castmesh us / MPI us (above 1: castmesh slower); busbw as NCCL-tests (allreduce x2(n-1)/n,"
echo "allgather x(n-1)/n, size = the gathered buffer); pingpong: one-way latency (half a round trip)."

for n in $ranks; do
  oversubscribed=""
  [[ $n -gt $cores ]] && oversubscribed=" (oversubscribed: $n ranks on $cores cores)"
  echo
  echo "=============== $n ranks$oversubscribed"
  for ((round = 1; round <= rounds; ++round)); do
    cm_args=("${castmesh_mpirun_args[@]}")
    if [[ $tcp -eq 1 ]]; then cm_args+=(-x "CASTMESH_RENDEZVOUS=tcp:127.0.0.1:$(free_port)"); fi
    mpirun "${mpirun_args[@]}" "${cm_args[@]}" -n "$n" "$castmesh_bin" --tsv "${bench_args[@]}" >"$work/castmesh.$round.tsv"
    mpirun "${mpirun_args[@]}" "${mpi_mpirun_args[@]}" -n "$n" "$mpi_bin" --tsv "${bench_args[@]}" >"$work/mpi.$round.tsv"
  done
  awk -F'\t' -f - lib=1 "$work"/castmesh.*.tsv lib=2 "$work"/mpi.*.tsv <<'AWK'
    function label(b) {
      if (b == 0) return "-"
      if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
      if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
      return b " B"
    }
    # The median of a space-separated list of numbers ("" for none).
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      if (n == 0) return ""
      for (i = 2; i <= n; ++i) {
        t = a[i] + 0
        for (j = i - 1; j >= 1 && a[j] + 0 > t; --j) a[j + 1] = a[j]
        a[j + 1] = t
      }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function fmt(v, f) { return v == "" ? "-" : sprintf(f, v) }
    FNR == 1 { files[lib]++ }
    $1 == "info" && $2 == "setup" && files[lib] == 1 { setup[lib] = setup[lib] "  " $3 "\n" }
    $1 == "note" && files[lib] == 1 { notes = notes "  note (" (lib == 1 ? "castmesh" : "MPI") "): " $2 "\n" }
    $1 == "row" {
      key = $2 SUBSEP $3
      if (!(key in seen)) { seen[key] = 1; order[++rows] = key; op[key] = $2; bytes[key] = $3 }
      us[lib, key] = us[lib, key] " " $4; bw[lib, key] = bw[lib, key] " " $5
    }
    END {
      printf "castmesh:\n%sMPI:\n%s", setup[1], setup[2]
      if (files[1] > 1) printf "each figure: the median over %d rounds (castmesh and MPI runs alternating)\n", files[1]
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
        c = median(us[1, k]); m = median(us[2, k])
        cb = median(bw[1, k]); mb = median(bw[2, k])
        if (o == "memcpy") {
          printf "%9s | %11s %11s | %13s %13s\n", label(bytes[k]), fmt(c == "" ? "" : c * 1e3, "%.1f"),
                 fmt(m == "" ? "" : m * 1e3, "%.1f"), fmt(cb, "%.2f"), fmt(mb, "%.2f")
          continue
        }
        ratio = (c != "" && m != "" && m > 0) ? sprintf("%.2f", c / m) : "-"
        floor = o == "barrier" ? "" : median(bw[1, "memcpy" SUBSEP bytes[k]])
        if (o == "barrier") { cb = ""; mb = "" }
        printf "%9s | %11s %11s %7s | %13s %13s | %11s\n", label(bytes[k]), fmt(c, "%.2f"), fmt(m, "%.2f"), ratio,
               fmt(cb, "%.3f"), fmt(mb, "%.3f"), fmt(floor, "%.2f")
      }
      printf "%s", notes
    }
AWK
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
