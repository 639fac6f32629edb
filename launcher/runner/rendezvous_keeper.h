// RendezvousKeeper: the job's rendezvous store in a process of its own,
// the runner's child (`python -m ftrun.rendezvous_store`: torch's TCPStore
// servers), so that no rank's death takes it down. The ranks connect to it as
// torchrun's workers do to their agent's store (TORCHELASTIC_USE_AGENT_STORE,
// rank_env.h).
//
// Every generation meets at a store of its own: torch 2.x's env://
// rendezvous with an agent store puts no per-attempt prefix on the keys (its
// agent makes a new store for each round), so a generation that reused the
// last one's server would read the dead generation's addresses and barrier
// counts. The process serves one TCPStore per generation: it prints
// "listening <port>" for each, and makes the next one when told "next" on
// its stdin. Take() hands the fresh one to a start (StartMsg::store) and asks
// for the next; before the first is up, between two starts too quick for it,
// and if the process dies, a generation's rank 0 hosts the store as under
// DeepSpeed's launcher (on a port of the generation's own).
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
#include "launcher/common/supervisor.h"
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
  // A child exited: true when it was this one (its addresses are then gone).
  bool Reaped(pid_t pid, const ExitInfo& info);

  // The fresh store's "host:port" for a generation that starts now, and the
  // process is asked for the next one. Empty when none is ready (rank 0
  // hosts that generation's store).
  std::string Take();

  // "host:port" of a store no generation has used yet; empty when none.
  const std::string& fresh() const { return fresh_; }
  // The one Take() handed out last (the running generation's); empty once
  // the process is gone.
  const std::string& current() const { return current_; }
  pid_t pid() const { return pid_; }
  // (Destroying it kills the process and reaps it.)

 private:
  bool ParseLine(const std::string& line);

  std::string host_;
  std::string fresh_;
  std::string current_;
  std::string out_;  // its stdout not yet parsed (a line at most)
  UniqueFd out_fd_;  // read end, non-blocking
  UniqueFd in_fd_;   // write end of its stdin, non-blocking
  pid_t pid_ = 0;
};

}  // namespace ftrun
