#!/usr/bin/env bash
# The demo: builds ftrun, then trains with 4 ranks under ftrun-agent, kills
# ranks mid-run (SIGKILL, then a hang), and shows that the run recovers each
# time and ends bit-identical to a run without failures.
set -euo pipefail
cd "$(dirname "$0")/.."
FTRUN_BUILD_TARGETS="ftrun-agent ftrun-synthetic" ./scripts/build.sh
exec /usr/bin/python3 integration/demo/local_demo.py "$@"
