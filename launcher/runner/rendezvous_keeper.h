// RendezvousKeeper: the job's rendezvous store in a process of its own,
// the runner's child (`python -m ftrun.rendezvous_store`: torch's TCPStore
// server), so that no rank's death takes it down. Once it listens, every
// start the coordinator sends names it (StartMsg::store) and the ranks
// connect to it as torchrun's workers do to their agent's store
// (TORCHELASTIC_USE_AGENT_STORE, a key prefix per generation: rank_env.h);
// before that, and if it dies, a generation's rank 0 hosts the store as
// under DeepSpeed's launcher.
//
// Started only for jobs that can recover warm (Python ranks,
// restart.warm_standbys not 0): a cold generation's processes are all new
// and meet at a port of their own anyway.
//
// Not thread-safe: driven by the runner's loop.
#pragma once

#include <sys/types.h>

#include <string>

#include "ftrun/status.h"
#include "launcher/agent/supervisor.h"
#include "plugin/common/fd.h"

namespace ftrun {

class RendezvousKeeper {
 public:
  RendezvousKeeper() = default;
  RendezvousKeeper(const RendezvousKeeper&) = delete;
  RendezvousKeeper& operator=(const RendezvousKeeper&) = delete;
  ~RendezvousKeeper();

  // Starts it with `python`; ranks will reach it at `host`.
  Status Start(const std::string& python, const std::string& host);
  // Reads what it printed so far (non-blocking): call from the loop.
  void Poll();
  // A child exited: true when it was this one (its address is then gone).
  bool Reaped(pid_t pid, const ExitInfo& info);

  // "host:port" once it takes connections; empty before and after.
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // (Destroying it kills the process and reaps it.)

 private:
  std::string host_;
  std::string address_;
  std::string out_;  // its stdout so far, up to the port line
  UniqueFd out_fd_;  // read end, non-blocking
  pid_t pid_ = 0;
};

}  // namespace ftrun
