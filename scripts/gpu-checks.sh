#!/usr/bin/env bash
# The checks that need a GPU or torch 2.x, in one run, each with a time
# limit, every log kept: the CUDA save path's tests (C++ and PyTorch), the
# save path under compute-sanitizer, `ftrun-bench save --cuda` (with
# train_gpt.py's step_overhead), the torch-2 FSDP and DCP tests, and the
# reuse of a save's packed structure with CUDA tensors.
# Where there is no GPU or no torch 2.x the tests skip (exit 77) and say so.
#
#   scripts/gpu-checks.sh [--build DIR] [--python PY] [--out DIR] [--quick]
#
#   --build   a build tree of this checkout (default: build)
#   --python  the interpreter with torch (default: python3 on PATH)
#   --out     where the logs and bench JSON go (default: gpu-checks-out)
#   --quick   skip compute-sanitizer and the step_overhead runs
#
# Exit code: 0 when every step passed or skipped, 1 otherwise (the summary
# at the end names each step's result).
set -u
cd "$(dirname "$0")/.."
build=build python=$(command -v python3 || echo python3) out=gpu-checks-out quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu-checks: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ ! -x "$build/ftrun-agent" ]; then
  echo "gpu-checks: no $build/ftrun-agent: build first (scripts/build.sh), or pass --build" >&2
  exit 2
fi
mkdir -p "$out"
build=$(cd "$build" && pwd) out=$(cd "$out" && pwd)
export FTRUN_BUILD_DIR=$build FTRUN_SOURCE_DIR=$PWD FTRUN_TEST_PYTHON=$python PYTHONPATH=$build/python
export PYTHONUNBUFFERED=1
summary=()
failed=0

# step NAME SECONDS COMMAND...: runs it with a limit, its output in OUT/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $(date +%T) $name"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$out/$name.log"
  case $rc in
    0) summary+=("$name: passed") ;;
    77) summary+=("$name: skipped") ;;
    124) summary+=("$name: TIMED OUT after ${limit}s"); failed=1 ;;
    *) summary+=("$name: FAILED (exit $rc)"); failed=1 ;;
  esac
}

finish() {
  echo "=== summary (logs in $out)"
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit $failed
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  "$python" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())" 2>&1 || true
} | tee "$out/machine.txt"

have_gpu=0
"$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1 && have_gpu=1
pytest=("$python" -m pytest -q -p no:cacheprovider)
if [ -x "$build/tests/ftrun_cuda_save_test" ]; then
  step cuda_save_test 120 "$build/tests/ftrun_cuda_save_test"
else
  summary+=("cuda_save_test: not built (no nvcc at build time)")
fi
step test_cuda_state 300 "${pytest[@]}" tests/gpu/test_cuda_state.py
step test_train_gpt_cuda 600 "${pytest[@]}" tests/gpu/test_train_gpt_cuda.py
step test_fsdp 600 "${pytest[@]}" tests/torch2/test_fsdp.py
step test_dcp 300 "${pytest[@]}" tests/torch2/test_dcp.py
step test_state_reuse 120 "${pytest[@]}" tests/unit_py/test_state_reuse.py
if [ "$have_gpu" = 0 ]; then
  summary+=("compute-sanitizer, bench_save_cuda: skipped ($python's torch sees no GPU)")
  finish
fi
if [ "$quick" = 0 ] && [ -x "$build/tests/ftrun_cuda_save_test" ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    step "sanitizer_$tool" 300 compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 9 \
      "$build/tests/ftrun_cuda_save_test"
  done
fi
bench=("$build/ftrun-bench" save --cuda --reps 3 --python "$python" --json "$out/save_cuda.json")
[ "$quick" = 1 ] && bench+=(--no-step-overhead)
step bench_save_cuda 600 "${bench[@]}"

finish
