#include "launcher/agent/release_connections.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "plugin/common/fd.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace ftrun {

namespace {

// fd number -> socket inode, for each socket of `pid`.
template <class F>
void ForEachSocket(pid_t pid, F f) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    char link[64] = {};
    ssize_t n = ::readlinkat(::dirfd(d), e->d_name, link, sizeof(link) - 1);
    if (n <= 0 || std::strncmp(link, "socket:[", 8) != 0) continue;
    f(static_cast<int>(fd), std::strtoull(link + 8, nullptr, 10));
  }
  ::closedir(d);
}

int LocalPort(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

enum class Verdict { kRelease, kNever, kNotYet };

// A connected TCP socket that is not a listener nor bound to `store_port`
// goes; one still connecting is looked at again.
Verdict Judge(int fd, int store_port) {
  int type = 0, listening = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return Verdict::kNever;
  len = sizeof(listening);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening) return Verdict::kNever;
  sockaddr_storage local{}, peer{};
  len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return Verdict::kNever;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return Verdict::kNever;
  if (LocalPort(local) == store_port) return Verdict::kNever;
  len = sizeof(peer);
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 ? Verdict::kRelease : Verdict::kNotYet;
}

}  // namespace

std::set<uint64_t> SocketInodes(pid_t pid) {
  std::set<uint64_t> out;
  ForEachSocket(pid, [&](int, uint64_t ino) { out.insert(ino); });
  return out;
}

Status ReleaseConnections(pid_t pid, int store_port, std::set<uint64_t>* settled, int* released) {
  *released = 0;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return Status::FromErrno("pidfd_open(" + std::to_string(pid) + ")", errno);
  Status result;
  ForEachSocket(pid, [&](int fd, uint64_t ino) {
    if (settled->count(ino) != 0) return;
    UniqueFd dup(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
    if (!dup.valid()) {
      if (result.ok())
        result = Status::FromErrno("pidfd_getfd(" + std::to_string(pid) + ", " + std::to_string(fd) + ")", errno);
      return;
    }
    switch (Judge(dup.get(), store_port)) {
      case Verdict::kRelease:
        if (::shutdown(dup.get(), SHUT_RDWR) != 0) return;  // (gone meanwhile: looked at again)
        ++*released;
        settled->insert(ino);
        return;
      case Verdict::kNever:
        settled->insert(ino);
        return;
      case Verdict::kNotYet:
        return;
    }
  });
  return result;
}

}  // namespace ftrun
