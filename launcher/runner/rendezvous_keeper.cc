#include "launcher/runner/rendezvous_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "launcher/agent/rank_env.h"
#include "plugin/common/log.h"

namespace ftrun {

RendezvousKeeper::~RendezvousKeeper() {
  // It keeps nothing worth a clean exit (a Python process with torch loaded
  // can take a second to tear down): killed, and reaped before the runner
  // exits, so no zombie or orphan outlives the job.
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

Status RendezvousKeeper::Start(const std::string& python, const std::string& host) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe for the rendezvous store", errno);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  if (::fcntl(read_end.get(), F_SETFL, O_NONBLOCK) != 0) return Status::FromErrno("fcntl O_NONBLOCK", errno);
  SpawnSpec spec;
  spec.argv = {python, "-u", "-m", "ftrun.rendezvous_store", "--host", host};
  spec.env = OwnPythonEnv();
  spec.stdout_fd = write_end.get();
  FTRUN_RETURN_IF_ERROR(SpawnProcess(spec, &pid_));
  host_ = host;
  out_fd_ = std::move(read_end);
  FTRUN_LOG_DEBUG("rendezvous store: started (pid {})", pid_);
  return Status::Ok();
}

void RendezvousKeeper::Poll() {
  if (!out_fd_.valid()) return;
  char buf[256];
  ssize_t n;
  while ((n = ::read(out_fd_.get(), buf, sizeof(buf))) > 0) out_.append(buf, static_cast<size_t>(n));
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) out_fd_ = UniqueFd();
  const std::string prefix = "listening ";
  const size_t eol = out_.find('\n');
  if (eol == std::string::npos) {
    if (out_.size() > 4096) out_fd_ = UniqueFd();  // not the line expected: never trusted
    return;
  }
  const std::string line = out_.substr(0, eol);
  out_fd_ = UniqueFd();
  char* end = nullptr;
  const long port = line.rfind(prefix, 0) == 0 ? std::strtol(line.c_str() + prefix.size(), &end, 10) : 0;
  if (end == nullptr || *end != '\0' || port < 1 || port > 65535) {
    FTRUN_LOG_WARN("rendezvous store (pid {}): expected 'listening <port>' on its stdout, got '{}'; rank 0 hosts it",
                   pid_, line.substr(0, 200));
    return;
  }
  address_ = host_ + ":" + std::to_string(port);
  FTRUN_LOG_INFO("rendezvous store at {} (pid {}): every later generation meets there", address_, pid_);
}

bool RendezvousKeeper::Reaped(pid_t pid, const ExitInfo& info) {
  if (pid_ <= 0 || pid != pid_) return false;
  if (address_.empty()) {  // never listened (no torch for the ranks' Python: its stderr says)
    FTRUN_LOG_INFO("rendezvous store (pid {}) {} before it listened: each generation's rank 0 hosts it", pid,
                   info.Describe());
  } else {
    FTRUN_LOG_WARN("rendezvous store (pid {}) {}: each later generation's rank 0 hosts it", pid, info.Describe());
  }
  pid_ = 0;
  address_.clear();
  out_fd_ = UniqueFd();
  return true;
}

}  // namespace ftrun
