#!/usr/bin/env bash
# The layers of the C++ code, checked on its #include lines (docs/architecture.md,
# "Layers"): plugin/ includes nothing from recovery/ or launcher/; recovery/
# nothing from launcher/; the runner nothing from the agent's folder, nor the
# agent from the runner's. Prints every include that crosses a layer upward.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=()
check() {  # folder, forbidden include prefix (extended regex)
  while IFS= read -r hit; do bad+=("$hit"); done < <(git grep -nE "^#include \"($2)" -- "$1" || true)
}
check 'plugin/' 'recovery/|launcher/'
check 'recovery/' 'launcher/'
check 'launcher/runner/' 'launcher/agent/'
check 'launcher/common/' 'launcher/agent/|launcher/runner/'
check 'launcher/agent/' 'launcher/runner/'
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-layers: ${#bad[@]} include(s) reach up a layer (docs/architecture.md, \"Layers\"):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-layers: plugin < recovery < launcher/common < launcher/{agent,runner}, no include upward"
