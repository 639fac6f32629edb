# Sourced by scripts/test.sh, demo.sh and the benchmarks: runs what follows with
# the project's Python environment (.venv/, scripts/venv.sh) as if activated,
# so `python3` in every test, trainer and rank (FTRUN_PYTHON for the agent) is
# .venv/bin/python with torch 2.13.
FTRUN_VENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv
export VIRTUAL_ENV=$FTRUN_VENV
export PATH=$FTRUN_VENV/bin:$PATH
export FTRUN_PYTHON=$FTRUN_VENV/bin/python
unset PYTHONHOME
