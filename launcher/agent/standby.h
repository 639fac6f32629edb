// Standby: the ftrun-agent a Slurm prolog starts before the job's steps run
// (integration/slurm/prolog.sh, INTEGRATION.md section 4).
//
//   prolog:  ftrun-agent --standby --slurm-job 1234 --job-uid 1000 ...
//            setsid()s, leaves the prolog's stdout/stderr for a log file,
//            and listens on <standby dir>/slurm-1234.sock (owned by the job's
//            user, mode 0600).
//   srun:    ftrun-agent <the usual agent argv>  (started by `ftrun
//            --launcher slurm`, or by any srun wrapper) sees $SLURM_JOB_ID and
//            that socket, and attaches: it sends its argv, environment and
//            working directory, and its stdout/stderr descriptors, and waits.
//            The standby forks, drops to the job's uid/gid, and execs the
//            agent with exactly that argv, so the agent and its ranks live
//            outside the step (slurmd killing the step's processes does not
//            take the node's RAM copies with it) but print to the step's
//            output. SIGINT/SIGTERM/SIGHUP to the attached process are
//            forwarded to the agent; its exit code comes back and is the
//            attached process's own. If the attached process vanishes (the
//            step was killed), the standby stops the agent with SIGTERM.
//   epilog:  SIGTERM to the standby: every agent it runs gets SIGTERM (the
//            agent's own stop: ranks stopped within job.stop_grace); the
//            standby exits when they have, and integration/slurm/epilog.sh
//            bounds the wait and removes the job's files.
//
// Without a standby socket ftrun-agent simply runs in place, so the same
// srun line works on nodes whose prolog does not start ftrun.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace ftrun {

struct StandbyOptions {
  std::string slurm_job;    // --slurm-job (default $SLURM_JOB_ID)
  uid_t job_uid = 0;        // --job-uid (default $SLURM_JOB_UID, else our uid)
  gid_t job_gid = 0;        // --job-gid (default $SLURM_JOB_GID, else the user's group)
  std::string dir;          // --standby-dir (default $FTRUN_STANDBY_DIR or /run/ftrun)
  std::string pid_file;     // --pid-file (default <dir>/slurm-<job>.pid)
  std::string log_file;     // --log-file: stdout/stderr go here (default <dir>/slurm-<job>.log)
  bool foreground = false;  // --foreground: do not setsid/fork (tests, systemd)
};

// The directory standby sockets live in: $FTRUN_STANDBY_DIR or /run/ftrun.
std::string DefaultStandbyDir();
std::string StandbySocketPath(const std::string& dir, const std::string& slurm_job);

// ftrun-agent --standby ...: parses argv (argv[0] is the program), then
// detaches (unless --foreground) and serves attaches until SIGTERM/SIGINT.
// Returns the process exit code: 0 after a clean stop, 2 for bad input or a
// socket that cannot be made (the prolog then reports the node unusable).
int RunStandby(int argc, char** argv);

// standby_process.cc. Parses the standby's command line (false: exit with
// *exit_code, after --help or an error it printed).
bool ParseStandbyOptions(int argc, char** argv, StandbyOptions* o, int* exit_code);
// Writes this process's pid to `path` (never through a link; safe_dir.h).
bool WritePidFile(const std::string& path);
// Forks: the parent exits 0 once the child, in its own session with its
// output on o.log_file, has written its pid file; returns in the child.
bool Detach(const StandbyOptions& o);

// Called first by ftrun-agent's main(). When $SLURM_JOB_ID is set, we are not
// ourselves the standby's child, and a standby socket for that job exists,
// hands argv to the standby and returns the agent's exit code once it ends.
// Returns nullopt when there is no standby to attach to (run in place).
std::optional<int> AttachToStandby(int argc, char** argv);

}  // namespace ftrun
