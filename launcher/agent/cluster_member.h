// ClusterMember: this node's place in its job. It reaches the job's
// coordinator (the runner's over UCX for a multi-node job, or one it hosts
// in-process for a one-node job: local_coordinator.h), registers, sends the
// agent's reports (held reports batched per pass of the event loop), decodes
// the coordinator's orders, and carries out the ones that move data between
// agents: copies to this node's holders in a commit round (commit_round.h),
// and pulls of this node's shards from their holders before a restart
// (shard_pulls.h). What an order means for the ranks (halt them, start them
// from a version, end the job, fence them when the coordinator is lost) is
// the agent's: the Orders it implements.
//
// Not thread-safe: driven by the agent's event loop, on a Clock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/agent/agent_view.h"
#include "launcher/agent/commit_round.h"
#include "launcher/agent/coordinator_link.h"
#include "launcher/agent/erasure_member.h"
#include "launcher/agent/leader_watch.h"
#include "launcher/agent/local_coordinator.h"
#include "launcher/agent/peer_addresses.h"
#include "launcher/agent/shard_pulls.h"
#include "launcher/agent/version_retention.h"
#include "plugin/common/clock.h"
#include "plugin/config/config.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/replication/replicator.h"
#include "plugin/store/snapshot_store.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class ClusterMember {
 public:
  // What the coordinator's orders make the agent do, each decoded and
  // checked first (a malformed order is dropped with a WARN).
  class Orders {
   public:
    virtual ~Orders() = default;
    virtual RegisterMsg Registration() = 0;         // this node as the coordinator should know it (no epoch)
    virtual void Assign(const AssignMsg& m) = 0;    // a multi-node job's place for this node
    virtual void Start(const StartMsg& m) = 0;      // run the ranks from m.version
    virtual void Halt(uint64_t epoch) = 0;          // stop the ranks; say kHalted once stopped
    virtual void Readmitted(const PullMsg& m) = 0;  // a restore is planned: not fenced, and from disk here
    virtual void Committed(uint64_t version) = 0;   // a version the job knows to be committed
    virtual void Commit(const CommitMsg& m) = 0;    // a commit round ended
    virtual void DropAbove(uint64_t version) = 0;   // files above the job's newer commit go
    virtual void Ended(int code, const std::string& message, bool fenced) = 0;  // kStop or kFenced
    virtual void Lost(const std::string& why) = 0;                              // the coordinator is gone (for now)
    virtual void GaveUp() = 0;                                                  // gone for cluster.lost_node_timeout
    virtual void Heard(Clock::Time now) = 0;                                    // any message from a remote coordinator
    virtual void ShardPulled(int rank, uint64_t version, PeerId from) = 0;
    virtual void CorruptToSend(int rank, uint64_t version, const ChunkRef& chunk) = 0;
    virtual void Changed() = 0;  // something the status shows
  };

  struct Options {
    int agent_id = 0;
    std::string coordinator;  // empty: a one-node job, its coordinator hosted here
    std::string listen_ip;
    std::string secret_file;
    ClusterConfig cluster;
    // With etcd endpoints: the coordinator is whoever leads the job there
    // (leader_watch.h), and its orders carry its term.
    CoordinatorConfig leader;
    std::string job_id;
    uint64_t chunk_size = 0;
    // A hosted coordinator's (a one-node job's): its Options, with scan_disk
    // answered through DiskScanned.
    Coordinator::Options local;
  };

  // `store` and `retention` outlive the member; `arena_base` is the store's
  // mapping; `ranks` lists this node's global ranks now.
  ClusterMember(Options o, SnapshotStore* store, char* arena_base, VersionRetention* retention,
                std::function<std::vector<int>()> ranks, Orders* orders, const Clock& clock);
  ~ClusterMember();

  // Connects (remote) or creates the hosted coordinator and registers.
  Status Setup();
  bool remote() const { return !o_.coordinator.empty(); }
  int event_fd() const;  // the transport's (-1 for a one-node job)

  // The loop's turns: the transport's events; the hosted coordinator's
  // messages both ways (after each batch of events); the timers.
  // `done`: the agent has ended (the rest of the batch is not acted on).
  void Events(const std::function<bool()>& done);
  void Pump();
  void Tick(Clock::Time now);
  // The held reports of one pass of the event loop, in one message.
  void FlushHeld();

  // A report to the coordinator (its struct says its type). What was held
  // goes first: the coordinator reads the reports in the order things
  // happened here (a save, then the rank's exit).
  template <class M>
  void Report(const M& m) {
    Send(M::kType, Encode(m));
  }
  // A local rank's save is in the store.
  void RankSaved(int rank, uint64_t version);
  void DiskScanned(const Status& scan, std::vector<uint64_t> newest_first, Clock::Time now);

  uint64_t epoch() const { return epoch_; }
  bool up() const { return local_ || (link_ && link_->up()); }
  std::optional<AgentView::Cluster> View() const;  // a multi-node job's

 private:
  // On a halt or a start (once per order): a newer epoch the coordinator
  // named, and the generation's commit round is over.
  void JoinEpoch(uint64_t epoch);
  void EndRound();
  Status SetupRemote();
  void Register();
  void Send(ClusterMsg type, const std::string& payload);
  void OnOrder(uint16_t type, const std::string& payload);
  void Membership(const MembershipMsg& m);
  void Pull(const PullMsg& m);
  void SetupErasure();
  void Replicate(const ReplicateMsg& m);

  bool Current(std::string* payload);

  Options o_;
  SnapshotStore* const store_;
  char* const arena_base_;
  VersionRetention* const retention_;
  const std::function<std::vector<int>()> ranks_;
  Orders* const orders_;
  const Clock& clock_;

  uint64_t epoch_ = 0;
  std::vector<std::pair<int, uint64_t>> held_;  // (rank, version) held, not yet reported
  std::unique_ptr<LocalCoordinator> local_;     // a one-node job's
  // A multi-node job's: the transport, the runner's coordinator over it,
  // where the other agents listen, the copies, the pulls, the rounds.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<CoordinatorLink> link_;
  std::unique_ptr<PeerAddresses> peers_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<ShardPulls> pulls_;
  std::unique_ptr<CommitRound> round_;
  std::unique_ptr<ErasureMember> erasure_;  // cluster.redundancy erasure: parity instead of copies
  std::unique_ptr<LeaderWatch> watch_;      // etcd: who leads
  int64_t term_ = 0;                        // the newest coordinator term seen (etcd or an order)
  int64_t dropped_term_ = -1;               // the last deposed term whose order was dropped (logged once)
};

}  // namespace ftrun
