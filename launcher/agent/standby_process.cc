// How the standby runs as a daemon: its command line, its pid file, and detaching from the prolog
// (see standby.h).
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "launcher/agent/cgroup_join.h"
#include "launcher/agent/standby.h"
#include "plugin/common/bytes.h"
#include "plugin/common/fd.h"
#include "plugin/common/log.h"
#include "plugin/common/safe_dir.h"
#include "plugin/ipc/unix_socket.h"
#include "plugin/ipc/wire.h"

namespace ftrun {

bool ParseStandbyOptions(int argc, char** argv, StandbyOptions* o, int* exit_code) {
  CLI::App app{
      "ftrun-agent --standby: started by the Slurm prolog; runs the job's agents when srun starts ftrun-agent."};
  bool standby = false;
  long uid = -1, gid = -1;
  app.add_flag("--standby", standby, "run as the standby agent of a Slurm job");
  app.add_option("--slurm-job", o->slurm_job, "Slurm job id (default $SLURM_JOB_ID)");
  app.add_option("--job-uid", uid, "the job's user id (default $SLURM_JOB_UID)");
  app.add_option("--job-gid", gid, "the job's group id (default $SLURM_JOB_GID, else the user's group)");
  app.add_option("--standby-dir", o->dir, "socket directory (default $FTRUN_STANDBY_DIR or /run/ftrun)");
  app.add_option("--pid-file", o->pid_file, "where to write the standby's pid (default <dir>/slurm-<job>.pid)");
  app.add_option("--log-file", o->log_file, "the standby's and its agents' log (default <dir>/slurm-<job>.log)");
  app.add_flag("--foreground", o->foreground, "stay in the foreground (do not detach)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *exit_code = app.exit(e);
    if (*exit_code != 0) *exit_code = 2;
    return false;
  }
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "ftrun-agent --standby: %s\n", m.c_str());
    *exit_code = 2;
    return false;
  };
  if (o->slurm_job.empty()) o->slurm_job = env("SLURM_JOB_ID");
  if (o->slurm_job.empty()) return fail("no Slurm job: pass --slurm-job or set SLURM_JOB_ID");
  for (char c : o->slurm_job) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return fail("--slurm-job '" + o->slurm_job + "': expected letters, digits, '_', '.' or '-'");
    }
  }
  auto id = [&](long flag, const char* var, const char* what, long fallback, long* out) {
    std::string v = flag >= 0 ? std::to_string(flag) : env(var);
    if (v.empty()) return *out = fallback, true;
    char* end = nullptr;
    *out = std::strtol(v.c_str(), &end, 10);
    return *end == '\0' && *out >= 0 ? true : fail(std::string(what) + " '" + v + "': expected a numeric id");
  };
  long u = 0, g = 0;
  if (!id(uid, "SLURM_JOB_UID", "--job-uid/SLURM_JOB_UID", static_cast<long>(::getuid()), &u)) return false;
  const passwd* pw = ::getpwuid(static_cast<uid_t>(u));
  if (!id(gid, "SLURM_JOB_GID", "--job-gid/SLURM_JOB_GID", pw != nullptr ? pw->pw_gid : u, &g)) return false;
  o->job_uid = static_cast<uid_t>(u);
  o->job_gid = static_cast<gid_t>(g);
  if (o->dir.empty()) o->dir = DefaultStandbyDir();
  std::string base = o->dir + "/slurm-" + o->slurm_job;
  if (o->pid_file.empty()) o->pid_file = base + ".pid";
  if (o->log_file.empty()) o->log_file = base + ".log";
  return true;
}

bool WritePidFile(const std::string& path) {
  // Through a temporary name in the checked directory: never through a link.
  Status s = ReplaceFile(path, std::to_string(::getpid()) + "\n", /*check_dir=*/true, 0644);
  if (!s.ok()) FTRUN_LOG_ERROR("standby: cannot write the pid file: {}", s.message());
  return s.ok();
}

// Forks; the child setsid()s, moves its output to the log file and writes
// the pid file, then tells the parent (which exits 0) through a pipe, so
// the prolog returns only once the standby is out of its process group.
bool Detach(const StandbyOptions& o) {
  // Root appends to it: never through a link, and only to root's own file.
  int log = ::open(o.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640);
  struct stat st {};
  if (log < 0 || ::fstat(log, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    std::fprintf(stderr, "ftrun-agent --standby: cannot use the log file %s: %s\n", o.log_file.c_str(),
                 log < 0 ? std::strerror(errno) : "expected a regular file of the standby's own user, not a link");
    std::exit(2);
  }
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) std::exit(2);
  pid_t pid = ::fork();
  if (pid < 0) std::exit(2);
  if (pid > 0) {
    ::close(ready[1]);
    char b = 0;
    bool ok = ::read(ready[0], &b, 1) == 1;
    if (ok)
      std::printf("ftrun standby for slurm job %s: pid %d, log %s\n", o.slurm_job.c_str(), pid, o.log_file.c_str());
    std::exit(ok ? 0 : 2);
  }
  ::close(ready[0]);
  ::setsid();
  int null = ::open("/dev/null", O_RDONLY);
  ::dup2(null, 0);
  ::dup2(log, 1);
  ::dup2(log, 2);
  if (!WritePidFile(o.pid_file)) return false;
  char b = 1;
  return ::write(ready[1], &b, 1) == 1;
}

}  // namespace ftrun
