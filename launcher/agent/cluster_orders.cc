// ClusterMember: the coordinator's orders, each decoded into its struct
// (cluster_messages.h) and then acted on; a malformed one is dropped with a
// WARN, nothing of it acted on. The orders that move data between agents
// (membership, pulls, commit rounds) are carried out here; the rest are the
// agent's (ClusterMember::Orders).
#include "launcher/agent/cluster_member.h"
#include "plugin/common/log.h"

namespace ftrun {

void ClusterMember::OnOrder(uint16_t type, const std::string& payload) {
  auto on = [&](auto m, auto act) {
    if (Status s = Decode(payload, &m); !s.ok()) {
      FTRUN_LOG_WARN("coordinator sent a bad {}: {}", ClusterMsgName(type), s.message());
    } else {
      act(m);
    }
  };
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kCoordHeartbeat:
      return on(CoordHeartbeatMsg{}, [](const CoordHeartbeatMsg&) {});
    case ClusterMsg::kAssign:
      return on(AssignMsg{}, [&](const AssignMsg& m) { orders_->Assign(m); });
    case ClusterMsg::kMembership:
      return on(MembershipMsg{}, [&](const MembershipMsg& m) { Membership(m); });
    case ClusterMsg::kPull:
      return on(PullMsg{}, [&](const PullMsg& m) { Pull(m); });
    case ClusterMsg::kStart:
      return on(StartMsg{}, [&](const StartMsg& m) {
        // No halt comes before a new coordinator's first start: the start
        // ends the old generation's round and voids what an older epoch
        // built above its version (ranks still running save into nothing).
        JoinEpoch(m.epoch);
        EndRound();
        if (erasure_) erasure_->StartsFrom(m.epoch, m.version);
        orders_->Start(m);
      });
    case ClusterMsg::kHalt:
      return on(HaltMsg{}, [&](const HaltMsg& m) {
        JoinEpoch(m.epoch);
        EndRound();  // the stopped generation's round is over
        if (erasure_) erasure_->Halted();
        orders_->Halt(m.epoch);
      });
    case ClusterMsg::kDropAbove:
      return on(DropAboveMsg{}, [&](const DropAboveMsg& m) { orders_->DropAbove(m.version); });
    case ClusterMsg::kReplicate:
      return on(ReplicateMsg{}, [&](const ReplicateMsg& m) { Replicate(m); });
    case ClusterMsg::kCommit:
      return on(CommitMsg{}, [&](const CommitMsg& m) {
        orders_->Commit(m);
        if (erasure_) erasure_->Committed(m.version);
      });
    case ClusterMsg::kStop:
      return on(StopMsg{}, [&](const StopMsg& m) { orders_->Ended(m.code, m.message, false); });
    case ClusterMsg::kFenced:
      return on(FencedMsg{}, [&](const FencedMsg& m) { orders_->Ended(1, m.message, true); });
    default:
      FTRUN_LOG_WARN("coordinator sent an unexpected {}", ClusterMsgName(type));
  }
}

void ClusterMember::Membership(const MembershipMsg& m) {
  if (!replicator_) return;  // one node: nobody to copy to
  peers_->Set(m);
  peers_->Connect(m.my_holders);
  erasure_->Membership(m);
  replicator_->SetHolders(m.my_holders);
  replicator_->SetRoles(PeerRoles(m));
  orders_->Changed();
}

// A commit round: this node's saves of the version go to their holders
// (a one-node job's coordinator has no holders to order copies to).
void ClusterMember::Replicate(const ReplicateMsg& m) {
  if (m.epoch != epoch_ || !round_) return;
  const std::vector<int> ranks = ranks_();
  retention_->RoundTargets(m.version, ranks);
  round_->Begin(m.version, ranks);
}

// This node's shards of the committed version, from their holders over UCX
// (or from the persist directory: the agent's), before its ranks start.
void ClusterMember::Pull(const PullMsg& m) {
  JoinEpoch(m.epoch);
  if (pulls_) pulls_->Begin(m.epoch);  // (a one-node job's plans are all from disk)
  orders_->Readmitted(m);
  if (m.from_disk) return;
  if (!m.ranks.empty()) {
    // The committed version (a replacement may never have seen its commit):
    // a halt before the start must not drop it as uncommitted.
    orders_->Committed(m.version);
  }
  std::vector<int> rebuild;  // ranks with no copy left: from the erasure group
  for (const auto& [rank, holders] : m.ranks) {
    if (store_->Find(rank, m.version)) {  // already here (an earlier pull finished)
      Report(HeldMsg{m.epoch, {{rank, m.version}}});
      continue;
    }
    if (holders.empty() && !m.group.empty() && erasure_) {
      rebuild.push_back(rank);
      continue;
    }
    if (holders.empty() || !pulls_) {  // (a one-node job has no holders)
      return Report(FatalMsg{
          m.epoch, "rank " + std::to_string(rank) + " version " + std::to_string(m.version) + ": no live holder"});
    }
    pulls_->Add(rank, m.version, holders);
  }
  // The node's shard is coded whole: all its ranks are rebuilt (those it
  // still holds are kept as they are). It says ready.
  if (!rebuild.empty()) return erasure_->Rebuild(m, ranks_());
  if (pulls_)
    pulls_->Planned();
  else
    Report(ReadyMsg{m.epoch});
}

}  // namespace ftrun
