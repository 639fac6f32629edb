// Unix stream sockets for the agent <-> rank channel.
#pragma once

#include <sys/types.h>

#include <string>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

// Binds and listens on `path` (which must not exist), mode 0600.
Status ListenUnix(const std::string& path, UniqueFd* out);
// Connects to `path`, retrying while it does not exist yet or refuses, up to
// timeout_ms. The error names the path.
Status ConnectUnix(const std::string& path, int timeout_ms, UniqueFd* out);

struct PeerCredentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};
Status GetPeerCredentials(int fd, PeerCredentials* out);

}  // namespace ftrun
