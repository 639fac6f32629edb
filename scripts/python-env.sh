# Sourced by scripts/test.sh, demo.sh and the benchmarks: runs what follows with
# the project's Python environment (.venv/, scripts/venv.sh) as if activated,
# so `python3` in every test, trainer and rank is
# .venv/bin/python with torch 2.13 (the agent runs `python3` from PATH).
FTRUN_VENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv
export VIRTUAL_ENV=$FTRUN_VENV
export PATH=$FTRUN_VENV/bin:$PATH
export TORCH_EXTENSIONS_DIR=$FTRUN_VENV/torch_extensions  # DeepSpeed's ops (scripts/venv.sh builds them)
unset PYTHONHOME
