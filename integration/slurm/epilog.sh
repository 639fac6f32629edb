#!/usr/bin/env bash
# Slurm Epilog for ftrun (INTEGRATION.md section 4). slurmd runs it as root on
# every node once the job ends. It stops the node's standby ftrun-agent (see
# prolog.sh): SIGTERM makes the standby SIGTERM every agent it runs, and each
# agent stops its ranks and ends its work; the wait is bounded by
# FTRUN_EPILOG_WAIT seconds (default 60), then the agents are SIGKILLed (their
# ranks die with them) and at last the standby. Then the job's files go: its
# socket and pid file, the agents' sockets, locks and job directories under
# the run directory, and any shared-memory segment named after the job.
#
# Exit status: non-zero drains the node, so it is non-zero only when a
# process of the job survives SIGKILL (the node is then not fit for the next
# job). No standby (the prolog did not start one, or it is gone): exit 0.
#
# Settings (environment, or $FTRUN_SLURM_CONF, default /etc/ftrun/slurm.env):
#   FTRUN_STANDBY_DIR  as in prolog.sh (default /run/ftrun)
#   FTRUN_RUN_DIR      the agents' agent.run_dir (default /tmp/ftrun)
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
run_dir=${FTRUN_RUN_DIR:-/tmp/ftrun}
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

rm -f -- "$pidfile" "$dir/slurm-$job.sock"
rm -rf -- "$run_dir/slurm-$job"-* /dev/shm/ftrun-slurm-"$job"-*
exit $status
