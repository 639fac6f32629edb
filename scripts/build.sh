#!/usr/bin/env bash
# Builds ftrun into build/ (or build-asan/ with --sanitize), installing the
# Debian packages it needs and making the Python environment (.venv/) first;
# the Python module is built for .venv/bin/python. One line per phase; CMake's and ninja's
# output go to build/logs/ (shown if a phase fails; FTRUN_VERBOSE=1 shows
# them as they happen).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
./scripts/install-deps.sh
./scripts/venv.sh
dir=build
# -g1: line tables only (backtraces and sanitizer reports still name file and
# line): ~65-75% of -g's compile time for the template-heavy sources
# (launcher/runner/runner_options.cc: 17 s against 26 s here).
flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-asan
  # -g1 here too: about 80% of -g's CPU time
  flags=(-DFTRUN_SANITIZE=ON -DFTRUN_BUILD_PYTHON=OFF -DFTRUN_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
    -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1)
fi
# ccache: a checkout built before on this machine (CI's clone, a second work
# tree) compiles only what changed. Paths under the checkout are hashed
# relative to it, and the build directory's path is not hashed, so another
# folder's clone hits the same entries. The cache lives outside the checkout
# (ccache's default, ~/.cache/ccache); without ccache the build is the same,
# only slower.
if command -v ccache >/dev/null; then
  launcher="env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache"  # (in the launcher: a plain ninja run too)
  flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_C_COMPILER_LAUNCHER="$launcher")
fi
phase "configuring $dir/ (cmake)" "configure-$dir.log" cmake -S . -B "$dir" -G Ninja \
  -DPython3_EXECUTABLE="$PWD/.venv/bin/python" "${flags[@]}"
# shellcheck disable=SC2086  # FTRUN_BUILD_TARGETS is a list of targets
phase "building $dir/ (ninja)" "build-$dir.log" ninja -C "$dir" ${FTRUN_BUILD_TARGETS:-}
