#include "launcher/common/supervisor.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ftrun {

std::string ExitInfo::Describe() const {
  if (!signaled) return "exited with code " + std::to_string(code);
  const char* name = ::sigabbrev_np(code);
  return std::string("killed by signal ") + std::to_string(code) + (name ? std::string(" (SIG") + name + ")" : "");
}

Status SpawnProcess(const SpawnSpec& spec, pid_t* pid) {
  if (spec.argv.empty()) return Status::InvalidArgument("no command to run for the rank");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!spec.log_file.empty()) {
    log_fd = ::open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return Status::FromErrno("open rank log " + spec.log_file, errno);
  }
  pid_t parent = ::getpid();
  pid_t child = ::fork();
  if (child < 0) {
    int err = errno;
    if (log_fd >= 0) ::close(log_fd);
    return Status::FromErrno("fork", err);
  }
  if (child == 0) {
    ::setpgid(0, 0);
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the agent died before prctl
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks signals for signalfd
    ::signal(SIGPIPE, SIG_DFL);                  // and ignores SIGPIPE; exec keeps that
    if (spec.stdin_fd >= 0) ::dup2(spec.stdin_fd, STDIN_FILENO);
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    } else {
      if (spec.stderr_fd >= 0) ::dup2(spec.stderr_fd, STDERR_FILENO);
      if (spec.stdout_fd >= 0) ::dup2(spec.stdout_fd, STDOUT_FILENO);
    }
    // Nothing but stdio crosses the exec: libraries (UCX's listening socket)
    // open descriptors without O_CLOEXEC, and a child holding the parent's
    // listening socket would keep its port and swallow its connections.
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    ::execvpe(argv[0], argv.data(), envp.data());
    // Only async-signal-safe calls here: write the message piecewise.
    const char* parts[] = {"ftrun-agent: cannot exec '", argv[0], "': ", ::strerrorname_np(errno), "\n"};
    for (const char* p : parts) {
      if (p != nullptr) (void)!::write(STDERR_FILENO, p, std::strlen(p));
    }
    ::_exit(127);
  }
  // Also set it from the parent, so the group exists before we signal it.
  ::setpgid(child, child);
  if (log_fd >= 0) ::close(log_fd);
  *pid = child;
  return Status::Ok();
}

void SignalGroup(pid_t pgid, int sig) {
  if (pgid <= 0) return;
  ::kill(-pgid, sig);
  if (sig != SIGKILL && sig != SIGCONT) ::kill(-pgid, SIGCONT);
}

Status BecomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return Status::FromErrno("prctl(PR_SET_CHILD_SUBREAPER)", errno);
  return Status::Ok();
}

bool ReapOne(pid_t* pid, ExitInfo* info) {
  int st = 0;
  pid_t p;
  do {
    p = ::waitpid(-1, &st, WNOHANG);
  } while (p < 0 && errno == EINTR);
  if (p <= 0) return false;
  *pid = p;
  if (WIFSIGNALED(st)) {
    info->signaled = true;
    info->code = WTERMSIG(st);
  } else {
    info->signaled = false;
    info->code = WEXITSTATUS(st);
  }
  return true;
}

}  // namespace ftrun
