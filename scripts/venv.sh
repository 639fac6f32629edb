#!/usr/bin/env bash
# Makes the project's Python environment, .venv/, from the machine's CPython
# 3.11 and installs requirements.txt into it (torch 2.13.0 CPU, DeepSpeed,
# Lightning, transformers, accelerate, pytest, the pinned clang-format, ...). The build, the tests, the
# demo, the benchmarks and every rank they start use .venv/bin/python.
# Safe to run again: nothing is installed while .venv/ already holds exactly
# requirements.txt (a stamp file records its hash). pip's output goes to
# build/logs/venv.log (shown if it fails).
#
# FTRUN_BASE_PYTHON picks the interpreter the venv is made from (default: the
# first python3.11 on PATH, else python3); the torch wheel on these machines is
# for CPython 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
venv=.venv
stamp=$venv/.ftrun-requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "ftrun: python: $venv/ up to date ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
base=${FTRUN_BASE_PYTHON:-$(command -v python3.11 || command -v python3 || true)}
if [ -z "$base" ]; then
  echo "ftrun: no python3.11 or python3 on PATH: set FTRUN_BASE_PYTHON to a CPython 3.11 with venv" >&2
  exit 2
fi
make_venv() {
  "$base" -m venv "$venv"
  # Byte-compiled once here (compileall on every core: ~45 s; pip's own
  # compiling took 76 s). Not left to the first import: where
  # PYTHONDONTWRITEBYTECODE is set (these machines set it), Python keeps no
  # .pyc and every process compiled torch and DeepSpeed again: 8 s instead of
  # 3 s for `import torch, deepspeed`, in each of the tests' hundreds of ranks.
  "$venv/bin/python" -m pip install --no-compile -r requirements.txt
  "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null
  "$venv/bin/python" -c 'import torch, deepspeed, lightning, pytest; print("torch", torch.__version__)'
  # DeepSpeed's one op for the CPU accelerator (its shared-memory collectives,
  # compiled by torch's extension builder), built once here rather than by
  # the first ranks that import deepspeed.
  DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$PWD/$venv/torch_extensions" "$venv/bin/python" -c \
    'from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder("ShareMemCommBuilder").load()'
}
phase "making the Python environment $venv/ from $base (pip, requirements.txt)" venv.log make_venv
echo "$want" >"$stamp"
