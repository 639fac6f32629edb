#!/usr/bin/env bash
# The test command: builds, checks that the C/C++/CUDA sources are as
# clang-format leaves them, runs every unit, transport and integration test
# (CTest), then runs the unit and transport tests, and the integration tests
# that need no Python module, again under AddressSanitizer and UBSan
# (runner, agents and ranks included; that build comes before CTest's).
# Packages and builds print one line per phase (their logs:
# build/logs/); the tests' output is shown whole.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
source scripts/python-env.sh
./scripts/check-format.sh
./scripts/check-layers.sh
# The integration tests that need no Python module run once, against the
# sanitized build (at the end, by build-asan/'s CTest), not in CTest's pass too: the same tests, with
# every memory and UB check on. (test_crash_modes is not one of them: ASan
# turns the trainer's deliberate segfault into its own exit code.)
sanitized=(test_restart_random_kills test_agent_lifecycle test_c_client test_cluster_node_loss test_persist
  test_slurm_scripts test_runner_attach test_security_dropin test_security_agent_socket test_security_agent_links
  test_security_run_dir test_security_attach test_security_restore_eio test_security_pull_to_disk
  test_security_standby_files test_metrics test_etcd_failover test_etcd_tls test_cluster_erasure)
# The sanitized build (build-asan/) before CTest, not beside it: its links
# (ASan binaries of ~200 MB each) once stalled the machine for two seconds in
# CI, and every node of a running job lost its coordinator. With ccache
# (scripts/build.sh) it compiles only what changed since this machine last
# built it.
FTRUN_BUILD_TARGETS="ftrun_unit_tests ftrun_transport_tests transport_peer ftrun-agent ftrun-runner ftrun-synthetic ftrun-c-client" \
  ./scripts/build.sh --sanitize
echo "ftrun: running the tests (ctest)..."
start=$SECONDS
(cd build && ctest --output-on-failure -j2 --timeout 600 -E "^integration: ($(IFS='|'; echo "${sanitized[*]}"))\$")
echo "ftrun: ctest: done in $((SECONDS - start))s"
start=$SECONDS
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# (the two binaries side by side: each waits on sockets and timers a good part of its ~20 s)
./build-asan/tests/ftrun_unit_tests > build-asan/unit_tests.log 2>&1 &
unit=$!
./build-asan/tests/ftrun_transport_tests > build-asan/transport_tests.log 2>&1 &
transport=$!
for t in "unit:$unit" "transport:$transport"; do
  if ! wait "${t#*:}"; then
    cat "build-asan/${t%%:*}_tests.log"
    echo "ftrun: the sanitized ${t%%:*} tests failed (above)" >&2
    exit 1
  fi
  tail -n 3 "build-asan/${t%%:*}_tests.log"
done
# CTest of build-asan/ runs them (FTRUN_BUILD_DIR: build-asan/), two at a time
# where they may share the machine, alone where they may not, as above.
(cd build-asan && ctest --output-on-failure -j2 --timeout 600 -R "^integration: ($(IFS='|'; echo "${sanitized[*]}"))\$")
echo "ftrun: the sanitized tests: done in $((SECONDS - start))s"
echo "ftrun: all tests passed"
