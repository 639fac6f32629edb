// PeerRoles: which agent may copy into, or pull from, this agent's store.
//
// Every peer that reaches the replicator has proved it holds the job's
// secret (plugin/transport/handshake.h); that makes it one of the job's
// agents, not necessarily one the job still counts on. A fenced agent that
// lives on, or an agent confused about its place, must not feed this store
// manifests or take shards out of it. The coordinator's membership names
// each role, and the replicator asks this object before it serves:
//   - a routine copy (kOffer) of rank r comes only from the member that
//     runs r's node, and only if this agent keeps that node's copies;
//   - a pull (kPullRequest) of rank r comes only from the member that runs
//     r's node (a replacement, or a node that lacks its own shards).
// Answers of copies this agent started (kWant, kStored, ...) are matched to
// those copies by the replicator itself.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "ftrun/status.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/transport/transport.h"

namespace ftrun {

class PeerRoles {
 public:
  PeerRoles() = default;
  // The membership as this agent received it.
  explicit PeerRoles(const MembershipMsg& m);

  // Whether any membership arrived yet, and its epoch.
  bool known() const { return known_; }
  uint64_t epoch() const { return epoch_; }

  // OK, or FailedPrecondition saying which role the peer lacks.
  Status MayOffer(PeerId peer, int rank) const;
  Status MayPull(PeerId peer, int rank) const;

 private:
  struct Member {
    int slot = -1;
    int first_rank = 0;
    int ranks = 0;
  };
  // The member that runs `rank`'s node, or a reason it is not `peer`.
  Status RunsRank(PeerId peer, int rank, const Member** member) const;

  bool known_ = false;
  uint64_t epoch_ = 0;
  std::map<PeerId, Member> members_;
  std::set<int> held_slots_;
};

}  // namespace ftrun
