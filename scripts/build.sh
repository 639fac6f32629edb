#!/usr/bin/env bash
# Builds ftrun into build/ (or build-asan/ with --sanitize), installing the
# Debian packages it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
dir=build
flags=()
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-asan
  flags+=(-DFTRUN_SANITIZE=ON -DFTRUN_BUILD_PYTHON=OFF -DFTRUN_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug)
fi
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
ninja -C "$dir" ${FTRUN_BUILD_TARGETS:-}
