#!/usr/bin/env bash
# Slurm Prolog for ftrun (INTEGRATION.md section 4). slurmd runs it as root on
# every node of a job before the job's steps, with SLURM_JOB_ID, SLURM_JOB_UID,
# SLURM_JOB_GID and friends set, and kills its process group once it exits.
#
# It starts the node's standby ftrun-agent for the job (ftrun-agent
# --standby): detached with setsid, output to a log file, listening on
# $FTRUN_STANDBY_DIR/slurm-<job>.sock for the job's user only. When the job
# then runs `ftrun --launcher slurm ...` (or any srun of ftrun-agent), each
# srun-started ftrun-agent hands its command line to this standby, which runs
# the agent and its ranks outside the step, as the job's user.
#
# Exit status: non-zero drains the node and requeues the job, so it is
# non-zero only when the node cannot run ftrun at all (no agent binary, no
# socket directory, the standby cannot start). Anything else is logged and
# the job runs; srun's ftrun-agent then simply runs in place.
#
# Settings (environment, or the file $FTRUN_SLURM_CONF, default
# /etc/ftrun/slurm.env, sourced when readable):
#   FTRUN_AGENT        the ftrun-agent binary (default: on PATH, else /usr/local/bin/ftrun-agent)
#   FTRUN_STANDBY_DIR  socket, pid and log directory (default /run/ftrun)
set -u
conf=${FTRUN_SLURM_CONF:-/etc/ftrun/slurm.env}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"

log() { echo "ftrun prolog (slurm job ${SLURM_JOB_ID:-?} on $(hostname)): $*" >&2; }

if [ -z "${SLURM_JOB_ID:-}" ]; then
  log "SLURM_JOB_ID is not set (not started by slurmd?): nothing to do"
  exit 0
fi
agent=${FTRUN_AGENT:-$(command -v ftrun-agent || echo /usr/local/bin/ftrun-agent)}
dir=${FTRUN_STANDBY_DIR:-/run/ftrun}
export FTRUN_STANDBY_DIR=$dir

if [ ! -x "$agent" ]; then
  log "the ftrun agent '$agent' is not an executable file (set FTRUN_AGENT in $conf): node unusable for ftrun"
  exit 1
fi
# 0755 whatever slurmd's umask: root writes there, the job's user only
# reaches the socket (the standby refuses a directory others can write).
if ! mkdir -p -m 0755 "$dir" || [ ! -w "$dir" ]; then
  log "cannot create or write the standby directory '$dir' (FTRUN_STANDBY_DIR): node unusable for ftrun"
  exit 1
fi

# ftrun-agent --standby forks, setsid()s, moves its output to the log file and
# returns once the socket listens, so slurmd's kill of this script's process
# group cannot reach it.
if ! out=$("$agent" --standby --slurm-job "$SLURM_JOB_ID" --standby-dir "$dir" </dev/null 2>&1); then
  log "the standby agent did not start: $out"
  exit 1
fi
log "$out"
exit 0
