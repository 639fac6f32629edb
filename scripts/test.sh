#!/usr/bin/env bash
# The test command: builds, checks that the C/C++/CUDA sources are as
# clang-format leaves them, runs every unit, transport and integration test
# (CTest), then runs the unit and transport tests, and the integration tests
# that need no Python module, again under AddressSanitizer and UBSan
# (runner, agents and ranks included). Packages and builds print one line
# per phase (their logs: build/logs/); the tests' output is shown whole.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
source scripts/python-env.sh
./scripts/check-format.sh
echo "ftrun: running the tests (ctest)..."
(cd build && ctest --output-on-failure -j2 --timeout 600)

FTRUN_BUILD_TARGETS="ftrun_unit_tests ftrun_transport_tests transport_peer ftrun-agent ftrun-runner ftrun-synthetic ftrun-c-client" ./scripts/build.sh --sanitize
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
./build-asan/tests/ftrun_unit_tests
./build-asan/tests/ftrun_transport_tests
# (test_crash_modes is left out here: ASan turns the trainer's deliberate
# segfault into its own exit code.)
for t in test_restart_random_kills test_agent_lifecycle test_c_client test_cluster_node_loss test_persist \
    test_slurm_scripts test_runner_attach test_security_dropin test_security_agent_socket test_security_agent_links \
    test_security_run_dir test_security_attach test_security_restore_eio test_security_pull_to_disk \
    test_security_standby_files test_metrics test_etcd_failover test_etcd_tls test_cluster_erasure; do
  echo "== $t (ASan+UBSan)"
  rc=0
  FTRUN_BUILD_DIR="$PWD/build-asan" FTRUN_SOURCE_DIR="$PWD" \
    python3 -m pytest -q -p no:cacheprovider "tests/integration/$t.py" || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"  # 77: every test skipped (as CTest shows it)
done
echo "ftrun: all tests passed"
