// The coordinator's membership: agents registering, slots assigned, spares taking over lost nodes, and
// the membership each agent is told (see coordinator.h).
#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

void Coordinator::Register(PeerId from, const RegisterMsg& m, Time now) {
  if (phase_ == Phase::kStopped) {
    return Send(from, StopMsg{exit_code_, exit_message_});
  }
  if (m.slot >= members_.slots()) {
    return Send(from, FencedMsg{"slot " + std::to_string(m.slot) + " does not exist (the job has " +
                                std::to_string(members_.slots()) + " nodes)"});
  }
  const std::optional<PeerId> place = m.slot >= 0 ? members_.Holder(m.slot) : std::nullopt;
  const bool same_slot = place == from;
  if (place && *place != from) {
    PeerId holder = *place;
    FTRUN_LOG_WARN("fenced agent {} at {}: node {} is agent {} now", from, m.address, m.slot, holder);
    return Send(from, FencedMsg{"node " + std::to_string(m.slot) + " was given to agent " + std::to_string(holder) +
                                " while this agent was unreachable"});
  }
  // What it knows: a restarted coordinator re-learns commits and epochs;
  // what it reported before is void, and it holds its catalog's ranks of
  // the committed version, and its parity rows count for the node it holds
  // again.
  rounds_.Registered(from, m.committed, m.catalog, m.parity, same_slot || (m.slot >= 0 && !place));
  epoch_ = std::max(epoch_, m.epoch);
  // An agent that ran ranks before (a restarted coordinator adopting its
  // agents): the start below is a restart of those fenced ranks.
  if (m.committed || !m.catalog.empty() || m.epoch > 0) agents_ran_ranks_ = true;
  // (An agent that held another node than the one it registers for now
  // left it: `left`.)
  auto [agent, left] = members_.Register(from, m.address, m.rack, m.slot, now);
  AgentInfo& a = *agent;
  FTRUN_LOG_INFO("agent {} registered from {} ({}), holding {} committed shards", from, m.address,
                 m.slot >= 0 ? "node " + std::to_string(m.slot) : std::string("spare"), m.catalog.size());
  if (left && phase_ != Phase::kForming) {
    return BeginRecovery("agent " + std::to_string(from) + " left node " + std::to_string(*left) +
                             ": it registered again as " +
                             (m.slot >= 0 ? "node " + std::to_string(m.slot) : std::string("a spare")),
                         1, now);
  }
  if (phase_ == Phase::kForming) {
    if (m.slot >= 0) Assign(a, m.slot);
    if (!members_.Full()) return;
    // Everyone is here: start the first generation (or the committed
    // version a restarted coordinator learned).
    phase_ = Phase::kRecovering;
    // A new epoch when the agents' ranks ran before: a rank must never see
    // the restart count (TORCHELASTIC_RESTART_COUNT) of the generation it
    // replaces, whose rendezvous may still be held.
    if (agents_ran_ranks_) epoch_++;
    for (auto& [id, x] : members_.agents()) x.halted = x.ready = true;
    recoveries_.push_back({epoch_, "job start", now, std::nullopt});
    if (!rounds_.committed() && o_.scan_disk) return ScanDisk(DiskNeed::kStart, "");  // DiskScanned starts it
    return MaybeStart(now);
  }
  if (same_slot) {
    // Same agent, same node, and it was never declared lost: it lost the
    // coordinator for a moment and fenced its own ranks. Resync everyone.
    Assign(a, m.slot);
    return BeginRecovery("agent " + std::to_string(from) + " (node " + std::to_string(m.slot) + ") reconnected", 1,
                         now);
  }
  if (phase_ == Phase::kRunning && m.slot >= 0 && !members_.Holder(m.slot)) {
    Assign(a, m.slot);
    return BeginRecovery("agent " + std::to_string(from) + " rejoined as node " + std::to_string(m.slot), 1, now);
  }
  if (phase_ == Phase::kRecovering) {
    if (m.slot >= 0 && !members_.Holder(m.slot)) {
      // The lost node's agent is back (restarted, or its link healed).
      Assign(a, m.slot);
      a.halted = true;
      a.ready = false;
      const std::optional<uint64_t> committed = rounds_.committed();
      std::vector<int> missing;
      for (int rank : members_.SlotRanks(m.slot)) {
        bool has =
            std::find(m.catalog.begin(), m.catalog.end(), RankVersion{rank, committed.value_or(0)}) != m.catalog.end();
        if (committed && !has) missing.push_back(rank);
      }
      PullMsg p{epoch_, committed.value_or(0), {}};
      for (int rank : missing) {
        auto h = rounds_.HoldersAlive(rank, *committed);
        p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      }
      if (disk_restore_) p = DiskPull(m.slot);
      BroadcastMembership();
      SendPull(from, m.slot, p);  // it answers kReady, even with nothing to pull
    }
    AssignReplacements(now);
    MaybeStart(now);
  }
}

void Coordinator::Assign(AgentInfo& a, int slot) {
  members_.Assign(a, slot);
  AssignMsg m{slot, members_.FirstRank(slot), members_.RanksOf(slot), members_.WorldSize(),
              static_cast<int32_t>(members_.slots())};
  Send(a.id, m);
}

void Coordinator::AssignReplacements(Time now) {
  (void)now;
  for (int s = 0; s < members_.slots(); ++s) {
    if (members_.Holder(s)) continue;
    AgentInfo* spare = members_.FirstSpare();
    if (spare == nullptr) {
      FTRUN_LOG_WARN(
          "node {} has no agent and there is no spare: waiting up to {} ms (cluster.lost_node_timeout) "
          "for its agent to come back",
          s, o_.lost_node_timeout.count());
      return;
    }
    FTRUN_LOG_INFO("spare agent {} takes over node {}", spare->id, s);
    Assign(*spare, s);
    spare->halted = true;
    spare->ready = false;
    BroadcastMembership();
    if (disk_restore_) {
      Send(spare->id, DiskPull(s));
    } else {
      const std::optional<uint64_t> committed = rounds_.committed();
      PullMsg p{epoch_, committed.value_or(0), {}};
      for (int rank : members_.SlotRanks(s)) {
        auto h = rounds_.HoldersAlive(rank, committed.value_or(0));
        // Spread the pulls: start each rank at a different holder.
        if (!h.empty()) std::rotate(h.begin(), h.begin() + (rank % static_cast<int>(h.size())), h.end());
        if (committed) p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      }
      SendPull(spare->id, s, p);  // answered by kReady
    }
  }
}

// Each agent gets the members it deals with (Membership::MessageFor).
void Coordinator::BroadcastMembership() {
  for (auto& [id, a] : members_.agents()) {
    if (a.alive) Send(id, members_.MessageFor(a, epoch_));
  }
}

}  // namespace ftrun
