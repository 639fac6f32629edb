#include "plugin/ipc/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ftrun {
namespace {

Status MakeAddr(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr->sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is longer than " +
                                   std::to_string(sizeof(addr->sun_path) - 1) + " bytes; use a shorter agent.run_dir");
  }
  std::memcpy(addr->sun_path, path.c_str(), path.size());
  return Status::Ok();
}

}  // namespace

Status ListenUnix(const std::string& path, UniqueFd* out) {
  sockaddr_un addr;
  FTRUN_RETURN_IF_ERROR(MakeAddr(path, &addr));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::FromErrno("socket", errno);
  mode_t old = ::umask(0077);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return Status::FromErrno("bind " + path, err);
  if (::listen(fd.get(), 128) != 0) return Status::FromErrno("listen " + path, errno);
  *out = std::move(fd);
  return Status::Ok();
}

Status ConnectUnix(const std::string& path, int timeout_ms, UniqueFd* out) {
  sockaddr_un addr;
  FTRUN_RETURN_IF_ERROR(MakeAddr(path, &addr));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return Status::FromErrno("socket", errno);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      *out = std::move(fd);
      return Status::Ok();
    }
    int err = errno;
    bool retry = err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR;
    if (!retry || std::chrono::steady_clock::now() >= deadline) {
      return Status(Code::kUnavailable, "cannot connect to the ftrun agent at " + path + ": " + std::strerror(err) +
                                            (retry ? " (gave up after " + std::to_string(timeout_ms) + " ms)" : ""));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status GetPeerCredentials(int fd, PeerCredentials* out) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno("getsockopt(SO_PEERCRED)", errno);
  }
  *out = {cred.pid, cred.uid, cred.gid};
  return Status::Ok();
}

}  // namespace ftrun
