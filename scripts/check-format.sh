#!/usr/bin/env bash
# Every C, C++ and CUDA file git tracks is as clang-format (.clang-format)
# leaves it. Prints the files that are not, and how to fix them.
# The clang-format is the one pinned in requirements.txt (.venv/bin/, made by
# scripts/venv.sh), so Debian 12 and 13 give the same answer.
set -euo pipefail
cd "$(dirname "$0")/.."
cf=.venv/bin/clang-format
if [ ! -x "$cf" ]; then
  echo "check-format: $cf is not there (scripts/venv.sh installs the pinned clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' '*.cu')
bad=()
for f in "${files[@]}"; do
  if ! "$cf" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from .clang-format ($("$cf" --version | head -1)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: $cf -i ${bad[*]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($("$cf" --version | head -1))"
