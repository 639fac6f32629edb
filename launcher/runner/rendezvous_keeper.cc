#include "launcher/runner/rendezvous_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "launcher/common/install_paths.h"
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
  int out[2], in[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("pipe for the rendezvous store", errno);
  UniqueFd read_end(out[0]), write_end(out[1]);
  // (A socket, not a pipe: a write after its death fails with EPIPE instead
  // of a SIGPIPE to the runner.)
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
    return Status::FromErrno("socketpair for the rendezvous store", errno);
  }
  UniqueFd its_stdin(in[0]), to_it(in[1]);
  if (::fcntl(read_end.get(), F_SETFL, O_NONBLOCK) != 0 || ::fcntl(to_it.get(), F_SETFL, O_NONBLOCK) != 0) {
    return Status::FromErrno("fcntl O_NONBLOCK", errno);
  }
  SpawnSpec spec;
  spec.argv = {python, "-u", "-m", "ftrun.rendezvous_store", "--host", host};
  spec.env = WithOwnPythonPackage(ProcessEnvironment());
  spec.stdout_fd = write_end.get();
  spec.stdin_fd = its_stdin.get();
  FTRUN_RETURN_IF_ERROR(SpawnProcess(spec, &pid_));
  host_ = host;
  out_fd_ = std::move(read_end);
  in_fd_ = std::move(to_it);
  FTRUN_LOG_DEBUG("rendezvous store: started (pid {})", pid_);
  return Status::Ok();
}

bool RendezvousKeeper::ParseLine(const std::string& line) {
  const std::string prefix = "listening ";
  char* end = nullptr;
  const long port = line.rfind(prefix, 0) == 0 ? std::strtol(line.c_str() + prefix.size(), &end, 10) : 0;
  if (end == nullptr || *end != '\0' || port < 1 || port > 65535) {
    FTRUN_LOG_WARN("rendezvous store (pid {}): expected 'listening <port>' on its stdout, got '{}'; rank 0 hosts it",
                   pid_, line.substr(0, 200));
    return false;
  }
  const bool first = current_.empty() && fresh_.empty();
  fresh_ = host_ + ":" + std::to_string(port);
  if (first) {
    FTRUN_LOG_INFO("rendezvous store at {} (pid {}): every later generation meets there, each at a store of its own",
                   fresh_, pid_);
  } else {
    FTRUN_LOG_DEBUG("rendezvous store: the next generation's at {}", fresh_);
  }
  return true;
}

void RendezvousKeeper::Poll() {
  if (!out_fd_.valid()) return;
  char buf[256];
  ssize_t n;
  while ((n = ::read(out_fd_.get(), buf, sizeof(buf))) > 0) out_.append(buf, static_cast<size_t>(n));
  const bool closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
  size_t eol;
  while ((eol = out_.find('\n')) != std::string::npos) {
    const std::string line = out_.substr(0, eol);
    out_.erase(0, eol + 1);
    if (!ParseLine(line)) {  // not the line expected: nothing it says is trusted again
      fresh_.clear();
      out_fd_ = UniqueFd();
      in_fd_ = UniqueFd();
      return;
    }
  }
  if (closed || out_.size() > 4096) out_fd_ = UniqueFd();  // (an endless line is never an address)
}

std::string RendezvousKeeper::Take() {
  std::string taken;
  taken.swap(fresh_);
  if (taken.empty()) return taken;
  current_ = taken;
  if (in_fd_.valid() && ::send(in_fd_.get(), "next\n", 5, MSG_NOSIGNAL | MSG_DONTWAIT) != 5) {
    FTRUN_LOG_WARN("rendezvous store (pid {}): cannot ask it for the next generation's store: {}", pid_,
                   std::strerror(errno));
    in_fd_ = UniqueFd();
  }
  return taken;
}

bool RendezvousKeeper::Reaped(pid_t pid, const ExitInfo& info) {
  if (pid_ <= 0 || pid != pid_) return false;
  if (fresh_.empty() && current_.empty()) {  // never listened (no torch for the ranks' Python: its stderr says)
    FTRUN_LOG_INFO("rendezvous store (pid {}) {} before it listened: each generation's rank 0 hosts it", pid,
                   info.Describe());
  } else {
    FTRUN_LOG_WARN("rendezvous store (pid {}) {}: each later generation's rank 0 hosts it", pid, info.Describe());
  }
  pid_ = 0;
  fresh_.clear();
  current_.clear();
  out_fd_ = UniqueFd();
  in_fd_ = UniqueFd();
  return true;
}

}  // namespace ftrun
