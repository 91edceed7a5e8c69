#!/usr/bin/env bash
# Installs the Debian packages castmesh builds against, plus any named on the
# command line. Idempotent. --list-missing [pkg...]: only prints the packages
# not installed yet (scripts/test.sh's probe), installs nothing.
set -euo pipefail
LIST_ONLY=0
if [ "${1:-}" = --list-missing ]; then LIST_ONLY=1; shift; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential cmake ninja-build pkg-config git
      ccache unzip file           # every CI build's compiler launcher; wheel checks; the cross check
      libasio-dev libprotobuf-dev protobuf-compiler libabsl-dev libspdlog-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev pybind11-dev
      python3-dev python3-venv libibverbs-dev patchelf
      openmpi-bin libopenmpi-dev  # the collectives benchmark's MPI peer (a smoke run in the dev ctest)
      iproute2 util-linux         # network-namespace test hosts (tests/testing/netns_hosts.sh)
      slurm-wlm munge)            # a real Slurm for castmesh.job's tests (scripts/slurm-up.sh)
missing=()
for p in "${PKGS[@]}" "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ "${LIST_ONLY}" = 1 ]; then echo "${missing[*]}"; exit 0; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "castmesh: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
