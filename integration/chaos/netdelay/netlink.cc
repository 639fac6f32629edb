#include "integration/chaos/netdelay/netlink.h"

#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ftrun::netdelay {

// "sendto (bind queue 3): Operation not permitted (EPERM)"
std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  return std::string(std::strerror(err)) + " (" + (name ? name : std::to_string(err)) + ")";
}

[[noreturn]] void Fatal(const std::string& what, int err) {
  std::fprintf(stderr, "%s: %s: %s\n", kProg, what.c_str(), ErrnoText(err).c_str());
  std::exit(1);
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

MnlSocket OpenNetfilterSocket(const char* purpose) {
  MnlSocket s(mnl_socket_open(NETLINK_NETFILTER));
  if (!s) Fatal(std::string("socket(AF_NETLINK, NETLINK_NETFILTER) for ") + purpose, errno);
  if (mnl_socket_bind(s.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    Fatal(std::string("bind(AF_NETLINK) for ") + purpose, errno);
  }
  return s;
}

}  // namespace ftrun::netdelay
