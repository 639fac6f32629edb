// A rank's hello (plugin/ipc/wire.h kHello): who it says it is, and whether
// the agent takes it as that rank. The socket's peer credentials (SO_PEERCRED)
// are what is trusted, never the pid the rank writes: the connecting process
// must lead the process group the agent started the rank in, so no other
// process of the node's user can connect as a rank and reach the store.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ftrun/status.h"
#include "plugin/ipc/rank_messages.h"

namespace ftrun {

// (The hello itself, its role and its codec: plugin/ipc/rank_messages.h.)
constexpr int kMaxWritersPerRank = 4;

// What the agent knows when a hello arrives.
struct HelloCheck {
  uint32_t protocol = 0;  // the agent's
  std::string job_id;
  int first_rank = 0;
  int local_ranks = 0;
  bool running = false;         // the ranks run (not stopping, not idle)
  bool is_local_rank = false;   // hello.rank is one of this node's
  pid_t rank_pid = 0;           // the rank's process as started (0: gone)
  bool rank_connected = false;  // the rank has a live connection already
  int writers = 0;              // the rank's writer connections now
  pid_t peer_pgid = 0;          // the connecting process's group (from SO_PEERCRED's pid)
  pid_t peer_pid = 0;           // that pid, for the error
};

// Ok, or why the hello is refused (the rank is told, the connection closed).
Status CheckHello(const RankHello& h, const HelloCheck& c);

}  // namespace ftrun
