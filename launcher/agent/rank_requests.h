// RankRequests: what this node's ranks ask over the agent socket
// (rank_server.h owns the socket). A connection becomes a rank's by its
// hello (rank_hello.h: a rank of this node's current generation, from the
// process that leads that rank's group); then its saves and loads go to the
// store service, its reports of corrupted chunks to corrupt_chunks.h, and
// each frame counts as the rank's progress (hang detection). Any other
// frame, or one from a stopped generation, is refused and the connection
// closed.
//
// Not thread-safe: driven by the agent's event loop, on a Clock.
#pragma once

#include <functional>
#include <string>

#include "launcher/agent/connection.h"
#include "launcher/agent/corrupt_chunks.h"
#include "launcher/agent/generations.h"
#include "launcher/agent/rank_processes.h"
#include "launcher/agent/rank_server.h"
#include "launcher/agent/save_stalls.h"
#include "launcher/agent/store_service.h"
#include "launcher/agent/warm_ranks.h"

namespace ftrun {

class RankRequests {
 public:
  // Where the ranks are (the coordinator may assign this node another place
  // while no rank runs): what a hello is checked against and told.
  struct Place {
    std::string job_id;
    int node_rank = 0;
    int first_rank = 0;
    int local_ranks = 0;
    uint64_t chunk_size = 0;
    int store_fd = -1;  // the store's memory, passed with the hello's answer
  };
  struct Parts {  // each outliving this
    RankServer* server = nullptr;
    RankProcesses* ranks = nullptr;
    Generations* generations = nullptr;
    StoreService* service = nullptr;
    CorruptChunks* corrupt = nullptr;
    WarmRanks* warm = nullptr;     // the control links of @ftrun.resilient processes
    SaveStalls* stalls = nullptr;  // what the ranks report of their saves' stalls
  };

  RankRequests(Parts parts, std::function<Place()> place, const Clock& clock)
      : p_(parts), place_(std::move(place)), clock_(clock) {}

  void Frame(Connection& conn, MsgType type, const std::string& payload);
  void Closed(Connection& conn);  // before the connection goes

 private:
  void Hello(Connection& conn, const std::string& payload);
  void WriterFrame(Connection& conn, MsgType type, const std::string& payload);

  const Parts p_;
  const std::function<Place()> place_;
  const Clock& clock_;
};

}  // namespace ftrun
