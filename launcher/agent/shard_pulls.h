// ShardPulls: a node's pulls of its ranks' shards of the committed version
// from the nodes holding copies (the coordinator's kPull), before its ranks
// start. The bytes move in the replicator (plugin/replication); this keeps
// the plan: which holder each rank is asked next, and when the node is
// ready or the coordinator must decide.
//
// Each rank's holders are asked in turn, the whole list kRounds times: a
// connection reset (a peer's stalled copy cancelled, a network fault) fails
// a pull from a holder that still has the shard, and the second time round
// it reconnects. A rank whose holders all failed, or a plan that did not
// finish within `timeout` (cluster.lost_node_timeout), is reported failed
// once and the node never says ready: the coordinator decides (another
// holder, the disk, or the job's end).
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plugin/common/clock.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class ShardPulls {
 public:
  static constexpr int kRounds = 2;
  // Starts pulling (rank, version) from `holder`; returns the pull's id.
  using Pull = std::function<uint64_t(PeerId holder, int rank, uint64_t version)>;

  ShardPulls(const ftrun::Clock& clock, std::chrono::milliseconds timeout, Pull pull);

  std::function<void(uint64_t epoch)> on_ready;                            // every shard of the plan is here
  std::function<void(const PullFailedMsg&)> on_failed;                     // for the coordinator
  std::function<void(int rank, uint64_t version, PeerId from)> on_pulled;  // one shard arrived whole

  // A new plan in `epoch`: the pulls of the last one are forgotten (their
  // ends ignored).
  void Begin(uint64_t epoch);
  // Pulls (rank, version) from `holders` (not empty), in this order.
  void Add(int rank, uint64_t version, std::vector<uint32_t> holders);
  // The plan's pulls are all added: ready at once if there were none.
  void Planned();
  // The replicator's end of pull `pull`.
  void Ended(uint64_t pull, PeerId from, int rank, uint64_t version, const Status& s);
  // Gives up on a plan older than the timeout.
  void Tick(ftrun::Clock::Time now);

  bool idle() const { return pulls_.empty(); }

 private:
  struct State {
    std::vector<uint32_t> holders;
    size_t next = 0;
    int round = 0;
    uint64_t version = 0;
    uint64_t xfer = 0;  // the pull in flight
  };
  void Next(int rank);

  const ftrun::Clock& clock_;
  const std::chrono::milliseconds timeout_;
  const Pull pull_;
  std::map<int, State> pulls_;
  uint64_t epoch_ = 0;
  bool failed_ = false;  // reported: the coordinator decides
  ftrun::Clock::Time started_;
};

}  // namespace ftrun
