#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every castmesh test (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset dev
cmake --build --preset dev
ctest --preset dev -j2
