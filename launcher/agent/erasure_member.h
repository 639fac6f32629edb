// ErasureMember: this node's part in an erasure-coded group
// (cluster.redundancy erasure), for ClusterMember: the parity it sends and
// holds (ParityExchange), the fragments it serves to a rebuild
// (FragmentServer), and its own rebuild when it replaces a lost node
// (ErasureRebuild). Idle until a membership names a group.
//
// A commit round's version is sent as deltas since the committed version
// once every rank of this node has saved it; each version whose parity rows
// here are complete is reported (on_parity_held: the commit needs every
// node's). Commits free older parity; a halt, or a start order, drops what
// was not committed.
//
// Not thread-safe: driven by the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/agent/peer_addresses.h"
#include "plugin/common/clock.h"
#include "plugin/erasure/erasure_rebuild.h"
#include "plugin/erasure/fragment_server.h"
#include "plugin/erasure/parity_exchange.h"
#include "plugin/protocol/cluster_messages.h"

namespace ftrun {

class ErasureMember {
 public:
  // `ranks`: this node's ranks now; `committed`: the version the job
  // committed (the deltas' base).
  ErasureMember(Transport* transport, SnapshotStore* store, char* arena_base, PeerAddresses* peers,
                std::function<std::vector<int>()> ranks, std::function<std::optional<uint64_t>()> committed,
                const Clock& clock);
  ~ErasureMember();

  bool enabled() const { return exchange_ != nullptr; }
  void Membership(const MembershipMsg& m);
  // A newer epoch ends the round under way (its saves were the old
  // generation's).
  void SetEpoch(uint64_t epoch);
  // Epoch `epoch` starts from `version` (a start order: after a restart, a
  // new coordinator, a go-back to the disk): the parity above it is void.
  void StartsFrom(uint64_t epoch, std::optional<uint64_t> version);
  // A rank of this node has `version`, the commit round's.
  void Saved(int rank, uint64_t version);
  void Committed(uint64_t version);
  // The ranks stopped: parity above the committed version is void.
  void Halted();

  // Rebuilds `ranks` of the pull's version from the group it names.
  void Rebuild(const PullMsg& m, std::vector<int> ranks);

  bool Handle(PeerId from, uint16_t type, const std::string& payload);
  bool BulkDone(uint64_t token, const Status& status);
  void PeerDown(PeerId peer);
  void Tick(Clock::Time now);

  std::function<void(uint64_t version)> on_parity_held;
  std::function<void(uint64_t version)> on_round_failed;
  std::function<void(uint64_t epoch, uint64_t version, const std::vector<int>& ranks)> on_rebuilt;
  std::function<void(const PullFailedMsg&)> on_rebuild_failed;

  // For the status: none until a membership names a group.
  const ParityExchange* exchange() const { return exchange_.get(); }

 private:
  Transport* t_;
  SnapshotStore* store_;
  char* base_;
  PeerAddresses* peers_;
  std::function<std::vector<int>()> ranks_;
  std::function<std::optional<uint64_t>()> committed_;
  const Clock& clock_;
  uint64_t epoch_ = 0;
  std::unique_ptr<GroupCode> code_;
  std::unique_ptr<ParityExchange> exchange_;
  std::unique_ptr<FragmentServer> server_;
  std::unique_ptr<ErasureRebuild> rebuild_;
  std::optional<uint64_t> round_;  // the round's version, and its ranks saved so far
  std::set<int> round_ranks_;
};

}  // namespace ftrun
