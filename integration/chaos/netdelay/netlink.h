// What every part of ftrun-netdelay shares: its name in messages, errno
// texts and the exit on a system error (exit 1, the message names the call
// and errno), the monotonic clock, and netfilter netlink sockets.
#pragma once

#include <libmnl/libmnl.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ftrun::netdelay {

constexpr char kProg[] = "ftrun-netdelay";

// "Operation not permitted (EPERM)"
std::string ErrnoText(int err);

// Prints "ftrun-netdelay: <what>: <ErrnoText(err)>" and exits with 1.
[[noreturn]] void Fatal(const std::string& what, int err);

// CLOCK_MONOTONIC in nanoseconds.
int64_t NowNs();

struct MnlCloser {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};
using MnlSocket = std::unique_ptr<mnl_socket, MnlCloser>;

// A bound NETLINK_NETFILTER socket; exits (Fatal) when it cannot be had.
MnlSocket OpenNetfilterSocket(const char* purpose);

}  // namespace ftrun::netdelay
