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

namespace ftrun {

// Who connects: the rank's own process (one connection), or a writer of the
// rank: another process of the rank's process group that saves versions for
// it beside the rank's connection (DCP's process checkpointer: dcp.async_save's
// background process). A writer may save and list versions, nothing else: it
// does not load, report progress or stalls, or count as the rank. A hello
// without the role byte (an older client) is the rank's.
enum class HelloRole : uint8_t { kRank = 0, kWriter = 1 };
constexpr int kMaxWritersPerRank = 4;

struct RankHello {
  uint32_t protocol = 0;
  int32_t rank = -1;
  std::string job;  // "" when the rank does not know its job
  HelloRole role = HelloRole::kRank;
  static Status Decode(const std::string& payload, RankHello* out);
};

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

// The agent's kHelloOk payload: the job, the node, the chunk size, and the
// version the rank restores (none: a fresh start). The store's memfd goes
// with it.
std::string EncodeHelloOk(const std::string& job_id, int node, uint64_t chunk_size,
                          std::optional<uint64_t> restore_version);

}  // namespace ftrun
