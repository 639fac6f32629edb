// InstanceLock: one agent per (job, node) in a run directory. The agent
// holds an flock on <run_dir>/<job>.node<k>.lock for its lifetime, so a lock
// that can be taken means any socket left next to it is stale (its agent
// died) and is removed; a lock that cannot be taken means a live agent owns
// the socket, and the new agent refuses to start.
//
// The store itself is a memfd, which dies with its last holder: there is no
// named segment an earlier job could leave behind. Ranks still check the
// segment header's job id when they map it.
#pragma once

#include <sys/types.h>

#include <string>

#include "ftrun/status.h"
#include "plugin/common/fd.h"

namespace ftrun {

class InstanceLock {
 public:
  InstanceLock() = default;
  ~InstanceLock();
  InstanceLock(InstanceLock&&) = default;
  InstanceLock& operator=(InstanceLock&&) = default;

  // Opens run_dir (creating it 0700 if needed) with every component checked
  // (plugin/common/safe_dir.h), takes the lock, removes a stale socket.
  // kAlreadyExists names the live agent's pid and socket.
  static Status Claim(const std::string& run_dir, const std::string& job_id, int node, InstanceLock* out);

  const std::string& socket_path() const { return socket_path_; }
  bool removed_stale_socket() const { return removed_stale_; }

 private:
  UniqueFd lock_fd_;
  std::string lock_path_;
  std::string socket_path_;
  bool removed_stale_ = false;
};

}  // namespace ftrun
