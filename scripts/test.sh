#!/usr/bin/env bash
# The test command: builds, runs every unit and integration test (CTest),
# then runs the unit tests again under AddressSanitizer and UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
(cd build && ctest --output-on-failure -j2 --timeout 600)
FTRUN_BUILD_TARGETS=ftrun_unit_tests ./scripts/build.sh --sanitize
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ./build-asan/tests/ftrun_unit_tests
echo "ftrun: all tests passed"
