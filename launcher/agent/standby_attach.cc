// The attaching side of the standby (see standby.h): ftrun-agent started by
// srun hands its argv to the node's standby agent and becomes a proxy for
// it: it forwards SIGINT/SIGTERM/SIGHUP and exits with the agent's code.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "launcher/agent/standby.h"
#include "plugin/common/bytes.h"
#include "plugin/common/fd.h"
#include "plugin/ipc/unix_socket.h"
#include "plugin/ipc/wire.h"

extern char** environ;

namespace ftrun {

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "ftrun-agent: %s\n", why.c_str());
  return 1;
}

// Waits for the agent's end, forwarding signals. Returns its exit code.
int Proxy(int sock) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  UniqueFd sigs(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  while (true) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sigs.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return Fail(std::string("poll: ") + std::strerror(errno));
    }
    signalfd_siginfo si;
    while (sigs.valid() && ::read(sigs.get(), &si, sizeof si) == sizeof si) {
      ByteWriter w;
      w.Put<int32_t>(static_cast<int32_t>(si.ssi_signo));
      (void)SendFrame(sock, MsgType::kAttachSignal, w.data());
    }
    if (fds[0].revents == 0) continue;
    MsgType type;
    std::string payload;
    Status s = RecvFrame(sock, 5000, &type, &payload);
    if (!s.ok()) return Fail("the standby agent went away before the job ended (" + s.message() + ")");
    if (type == MsgType::kAttachRefused) {
      Fail("the standby agent refused: " + payload);
      return 2;
    }
    if (type == MsgType::kAttachExit) {
      ByteReader r(payload);
      int32_t code = r.Get<int32_t>();
      return r.ok() ? code : Fail("malformed exit message from the standby agent");
    }
  }
}

}  // namespace

std::optional<int> AttachToStandby(int argc, char** argv) {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0' || std::getenv("FTRUN_STANDBY_CHILD") != nullptr) return std::nullopt;
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) return std::nullopt;
  std::string path = StandbySocketPath(DefaultStandbyDir(), job);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;  // no standby on this node: run in place
  UniqueFd sock;
  Status s = ConnectUnix(path, 0, &sock);
  if (!s.ok()) {
    std::fprintf(stderr, "ftrun-agent: the standby socket %s does not answer (%s); running in place\n", path.c_str(),
                 s.message().c_str());
    return std::nullopt;
  }
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(argc));
  w.PutString("ftrun-agent");  // argv[0]; the standby execs its own binary
  for (int i = 1; i < argc; ++i) w.PutString(argv[i]);
  uint32_t n = 0;
  for (char** e = environ; *e != nullptr; ++e) ++n;
  w.Put<uint32_t>(n);
  for (char** e = environ; *e != nullptr; ++e) w.PutString(*e);
  char cwd[PATH_MAX];
  w.PutString(::getcwd(cwd, sizeof cwd) != nullptr ? cwd : "/");
  s = SendFrame(sock.get(), MsgType::kAttach, w.data(), 1);
  if (s.ok()) s = SendFrame(sock.get(), MsgType::kAttachFd, "", 2);
  if (!s.ok()) return Fail("cannot attach to the standby agent at " + path + ": " + s.message());
  return Proxy(sock.get());
}

}  // namespace ftrun
