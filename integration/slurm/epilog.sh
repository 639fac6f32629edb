#!/usr/bin/env bash
# Slurm Epilog for ftrun (INTEGRATION.md section 4). slurmd runs it as root on
# every node once the job ends. It stops the node's standby ftrun-agent (see
# prolog.sh): SIGTERM makes the standby SIGTERM every agent it runs, and each
# agent stops its ranks and ends its work; the wait is bounded by
# FTRUN_EPILOG_WAIT seconds (default 60), then the agents are SIGKILLed (their
# ranks die with them) and at last the standby. Then the job's files go: its
# socket and pid file, the agents' sockets, locks and job directories under
# the run directory, and any shared-memory segment named after the job. The
# run directory itself goes too when it is the job user's default one
# (/run/user/<uid>/ftrun or /tmp/ftrun-<uid>, see plugin/config/
# default_run_dir.h) and nothing else is left in it. Removals run as the job's
# user (setpriv): root never deletes inside a directory a user can change.
#
# Exit status: non-zero drains the node, so it is non-zero only when a
# process of the job survives SIGKILL (the node is then not fit for the next
# job). No standby (the prolog did not start one, or it is gone): exit 0.
#
# Settings (environment, or $FTRUN_SLURM_CONF, default /etc/ftrun/slurm.env):
#   FTRUN_STANDBY_DIR  as in prolog.sh (default /run/ftrun)
#   FTRUN_RUN_DIR      the agents' agent.run_dir, when the jobs set one (default:
#                      the job user's default run directories, removed once empty)
#   FTRUN_EPILOG_WAIT  seconds to wait for the agents to stop (default 60)
set -u
conf=${FTRUN_SLURM_CONF:-/etc/ftrun/slurm.env}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"

log() { echo "ftrun epilog (slurm job ${SLURM_JOB_ID:-?} on $(hostname)): $*" >&2; }

job=${SLURM_JOB_ID:-}
if [ -z "$job" ]; then
  log "SLURM_JOB_ID is not set (not started by slurmd?): nothing to do"
  exit 0
fi
case $job in *[!A-Za-z0-9_.-]*) log "SLURM_JOB_ID '$job' has unexpected characters: nothing removed"; exit 0 ;; esac
dir=${FTRUN_STANDBY_DIR:-/run/ftrun}
run_dir=${FTRUN_RUN_DIR:-}
uid=${SLURM_JOB_UID:-}
case $uid in *[!0-9]*) uid= ;; esac
gid=${SLURM_JOB_GID:-}
case $gid in *[!0-9]*) gid= ;; esac
[ -n "$uid" ] && [ -z "$gid" ] && gid=$(id -g "$uid" 2>/dev/null)
bound=${FTRUN_EPILOG_WAIT:-60}
pidfile=$dir/slurm-$job.pid

# Is $1 still our standby? (Not a recycled pid: its command line must be
# ftrun-agent --standby for this job.)
is_standby() {
  [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q -- "--standby --slurm-job $job "
}
# Waits up to $2 seconds for pid $1 to exit.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do is_standby "$1" || return 0; sleep 0.1; done
  ! is_standby "$1"
}

status=0
pid=$(cat "$pidfile" 2>/dev/null || true)
if [ -n "$pid" ] && [ "$pid" -gt 0 ] 2>/dev/null && is_standby "$pid"; then
  kill -TERM "$pid"
  if wait_gone "$pid" "$bound"; then
    log "standby agent $pid stopped"
  else
    log "standby agent $pid still running after ${bound}s: its agents get SIGKILL"
    kill -TERM "$pid"  # the second SIGTERM: the standby SIGKILLs its agents
    if ! wait_gone "$pid" 5; then
      kill -KILL "$pid"
      if ! wait_gone "$pid" 5; then
        log "standby agent $pid survives SIGKILL: node not fit for the next job"
        status=1
      fi
    fi
  fi
else
  log "no standby agent running for this job"
fi

# Runs "$@" as the job's user when we are root and know who that is.
as_user() {
  if [ -n "$uid" ] && [ "$uid" != 0 ] && [ -n "$gid" ] && [ "$(id -u)" = 0 ]; then
    setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
  else
    "$@"
  fi
}
# Removes the job's entries (sockets, locks, job directories) from run dir $1;
# with $2 = rmdir also the directory itself once it is empty. Only a real
# directory (not a link) of the job's user or root is touched.
clean_run_dir() {
  local d=$1 owner
  { [ -d "$d" ] && [ ! -L "$d" ]; } || return 0
  owner=$(stat -c %u -- "$d") || return 0
  if [ -n "$uid" ] && [ "$owner" != "$uid" ] && [ "$owner" != 0 ]; then
    log "run dir $d belongs to uid $owner, not to the job's user (uid $uid): left alone"
    return 0
  fi
  local entries=("$d/slurm-$job"-*)
  [ -e "${entries[0]}" ] || [ -L "${entries[0]}" ] || entries=()
  [ ${#entries[@]} -eq 0 ] || as_user rm -rf -- "${entries[@]}"
  if [ "${2:-}" = rmdir ] && as_user rmdir -- "$d" 2>/dev/null; then log "removed the empty run dir $d"; fi
  return 0
}

rm -f -- "$pidfile" "$dir/slurm-$job.sock"
rm -rf -- /dev/shm/ftrun-slurm-"$job"-*
if [ -n "$run_dir" ]; then
  clean_run_dir "$run_dir"
elif [ -n "$uid" ]; then
  clean_run_dir "/run/user/$uid/ftrun" rmdir
  clean_run_dir "/tmp/ftrun-$uid" rmdir
else
  log "SLURM_JOB_UID is not set and FTRUN_RUN_DIR is not: the run directory is left as it is"
fi
exit $status
