# Sourced by scripts/install-deps.sh, build.sh, demo.sh and test.sh: one
# short line per phase on the terminal, the phase's full output in a log file
# that is shown (its end) when the phase fails. FTRUN_VERBOSE=1 shows
# everything as it happens instead.

FTRUN_LOG_DIR=${FTRUN_LOG_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/logs}

# phase WHAT LOGNAME CMD...: runs CMD with its output in $FTRUN_LOG_DIR/LOGNAME.
# On a terminal, lines of the form [N/M] (ninja) update a step count.
phase() {
  local what=$1 log=$FTRUN_LOG_DIR/$2 start=$SECONDS rc=0
  shift 2
  if [ "${FTRUN_VERBOSE:-0}" = 1 ]; then
    echo "ftrun: $what"
    "$@"
    return
  fi
  mkdir -p "$FTRUN_LOG_DIR"
  if [ -t 1 ]; then
    printf 'ftrun: %s...' "$what"
    { "$@" 2>&1 | _phase_progress "$what" "$log"; rc=${PIPESTATUS[0]}; } || true
  else
    echo "ftrun: $what..."
    "$@" >"$log" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    [ -t 1 ] && echo
    echo "ftrun: $what FAILED (exit $rc); the last lines of $log:"
    tail -n 40 "$log" | sed 's/^/  | /'
    echo "ftrun: the whole log: $log"
    exit "$rc"
  fi
  if [ -t 1 ]; then
    printf '\rftrun: %s: done in %ds\033[K\n' "$what" $((SECONDS - start))
  else
    echo "ftrun: $what: done in $((SECONDS - start))s"
  fi
}

# Copies stdin to the log; shows ninja's [N/M] counter on the phase's line.
_phase_progress() {
  local what=$1 log=$2 line
  : >"$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      printf '\rftrun: %s... %s/%s\033[K' "$what" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    fi
  done
}
