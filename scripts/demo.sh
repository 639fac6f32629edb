#!/usr/bin/env bash
# The demo: builds ftrun, then trains a small GPT (integration/examples/train_gpt.py)
# on 2 local nodes x 2 ranks plus a spare
# under the ftrun runner, kills a rank and then a whole node mid-run, and
# shows that the run recovers each time and ends bit-identical to a run
# without failures. Installing packages and building print one line each
# (their logs: build/logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
FTRUN_BUILD_TARGETS="ftrun-agent ftrun-runner _ftrun" ./scripts/build.sh
echo "ftrun: running the demo (integration/demo/local_demo.py)..."
source scripts/python-env.sh
exec python3 integration/demo/local_demo.py "$@"
