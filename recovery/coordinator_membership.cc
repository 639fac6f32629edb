// The coordinator's membership: agents registering, slots assigned, spares taking over lost nodes, and
// the membership each agent is told (see coordinator.h).
#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/coordinator.h"
#include "recovery/placement.h"

namespace ftrun {

void Coordinator::Register(PeerId from, const RegisterMsg& m, Time now) {
  if (phase_ == Phase::kStopped) {
    return Send(from, StopMsg{exit_code_, exit_message_});
  }
  if (m.slot >= static_cast<int>(slots_.size())) {
    return Send(from, FencedMsg{"slot " + std::to_string(m.slot) + " does not exist (the job has " +
                                std::to_string(slots_.size()) + " nodes)"});
  }
  const bool same_slot = m.slot >= 0 && slots_[static_cast<size_t>(m.slot)] == from;
  if (m.slot >= 0 && slots_[static_cast<size_t>(m.slot)] && *slots_[static_cast<size_t>(m.slot)] != from) {
    PeerId holder = *slots_[static_cast<size_t>(m.slot)];
    FTRUN_LOG_WARN("fenced agent {} at {}: node {} is agent {} now", from, m.address, m.slot, holder);
    return Send(from, FencedMsg{"node " + std::to_string(m.slot) + " was given to agent " + std::to_string(holder) +
                                " while this agent was unreachable"});
  }
  // What it knows: a restarted coordinator re-learns commits and epochs.
  if (m.committed && (!committed_ || *m.committed > *committed_)) {
    committed_ = m.committed;
    FTRUN_LOG_INFO("learned committed version {} from agent {}", *committed_, from);
  }
  epoch_ = std::max(epoch_, m.epoch);
  // An agent that ran ranks before (a restarted coordinator adopting its
  // agents): the start below is a restart of those fenced ranks.
  if (m.committed || !m.catalog.empty() || m.epoch > 0) agents_ran_ranks_ = true;
  for (auto& [v, ranks] : held_) {
    for (auto& [rank, holders] : ranks) holders.erase(from);  // its old reports are void
  }
  // Its parity too: an agent started again holds none; one that kept
  // running (a new coordinator adopting it) says which committed version
  // its rows cover, and they count for the node it holds again.
  for (auto& [v, agents] : parity_held_) agents.erase(from);
  for (const auto& [rank, version] : m.catalog) {
    if (committed_ && version == *committed_) held_[version][rank].insert(from);
  }
  if (m.parity && committed_ && *m.parity == *committed_ &&
      (same_slot || (m.slot >= 0 && !slots_[static_cast<size_t>(m.slot)])))
    parity_held_[*m.parity].insert(from);
  // An agent that holds a node and registers again for another place (a
  // spare, another node) leaves that node: it must not point at it.
  std::optional<int> left;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s] == from && static_cast<int>(s) != m.slot) left = static_cast<int>(s);
  }
  if (left) slots_[static_cast<size_t>(*left)].reset();
  AgentInfo& a = agents_[from];
  a = AgentInfo{};
  a.id = from;
  a.address = m.address;
  a.rack = m.rack;
  a.last_heard = now;
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
    bool full = std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s.has_value(); });
    if (!full) return;
    // Everyone is here: start the first generation (or the committed
    // version a restarted coordinator learned).
    phase_ = Phase::kRecovering;
    // A new epoch when the agents' ranks ran before: a rank must never see
    // the restart count (TORCHELASTIC_RESTART_COUNT) of the generation it
    // replaces, whose rendezvous may still be held.
    if (agents_ran_ranks_) epoch_++;
    for (auto& [id, x] : agents_) x.halted = x.ready = true;
    recoveries_.push_back({epoch_, "job start", now, std::nullopt});
    if (!committed_ && o_.scan_disk) return ScanDisk(DiskNeed::kStart, "");  // DiskScanned starts it
    return MaybeStart(now);
  }
  if (same_slot) {
    // Same agent, same node, and it was never declared lost: it lost the
    // coordinator for a moment and fenced its own ranks. Resync everyone.
    Assign(a, m.slot);
    return BeginRecovery("agent " + std::to_string(from) + " (node " + std::to_string(m.slot) + ") reconnected", 1,
                         now);
  }
  if (phase_ == Phase::kRunning && m.slot >= 0 && !slots_[static_cast<size_t>(m.slot)]) {
    Assign(a, m.slot);
    return BeginRecovery("agent " + std::to_string(from) + " rejoined as node " + std::to_string(m.slot), 1, now);
  }
  if (phase_ == Phase::kRecovering) {
    if (m.slot >= 0 && !slots_[static_cast<size_t>(m.slot)]) {
      // The lost node's agent is back (restarted, or its link healed).
      Assign(a, m.slot);
      a.halted = true;
      a.ready = false;
      std::vector<int> missing;
      for (int rank : SlotRanks(m.slot)) {
        bool has =
            std::find(m.catalog.begin(), m.catalog.end(), RankVersion{rank, committed_.value_or(0)}) != m.catalog.end();
        if (committed_ && !has) missing.push_back(rank);
      }
      PullMsg p{epoch_, committed_.value_or(0), {}};
      for (int rank : missing) {
        auto h = HoldersAlive(rank, *committed_);
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
  a.slot = slot;
  slots_[static_cast<size_t>(slot)] = a.id;
  AssignMsg m{slot, FirstRank(slot), o_.ranks_per_slot[static_cast<size_t>(slot)], WorldSize(),
              static_cast<int32_t>(slots_.size())};
  Send(a.id, m);
}

void Coordinator::AssignReplacements(Time now) {
  (void)now;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s]) continue;
    AgentInfo* spare = nullptr;
    for (auto& [id, a] : agents_) {
      if (a.alive && a.slot < 0) {
        spare = &a;
        break;
      }
    }
    if (spare == nullptr) {
      FTRUN_LOG_WARN(
          "node {} has no agent and there is no spare: waiting up to {} ms (cluster.lost_node_timeout) "
          "for its agent to come back",
          s, o_.lost_node_timeout.count());
      return;
    }
    FTRUN_LOG_INFO("spare agent {} takes over node {}", spare->id, s);
    Assign(*spare, static_cast<int>(s));
    spare->halted = true;
    spare->ready = false;
    BroadcastMembership();
    if (disk_restore_) {
      Send(spare->id, DiskPull(static_cast<int>(s)));
    } else {
      PullMsg p{epoch_, committed_.value_or(0), {}};
      for (int rank : SlotRanks(static_cast<int>(s))) {
        auto h = HoldersAlive(rank, committed_.value_or(0));
        // Spread the pulls: start each rank at a different holder.
        if (!h.empty()) std::rotate(h.begin(), h.begin() + (rank % static_cast<int>(h.size())), h.end());
        if (committed_) p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      }
      SendPull(spare->id, static_cast<int>(s), p);  // answered by kReady
    }
  }
}

// Each agent gets the members it deals with (MembershipMsg): itself, its
// holders (it copies to them; a replacement pulls from them) and the agents
// of the slots it holds (they copy to it, and pull from it).
void Coordinator::BroadcastMembership() {
  auto member = [&](PeerId id, const AgentInfo& a) {
    MemberInfo x{id, a.slot, a.address};
    if (a.slot >= 0) {
      x.first_rank = FirstRank(a.slot);
      x.ranks = o_.ranks_per_slot[static_cast<size_t>(a.slot)];
    }
    return x;
  };
  for (auto& [id, a] : agents_) {
    if (!a.alive) continue;
    MembershipMsg m;
    m.epoch = epoch_;
    m.members.push_back(member(id, a));
    auto add = [&](const AgentInfo* x) {
      if (x == nullptr) return;
      for (const MemberInfo& known : m.members) {
        if (known.agent == x->id) return;
      }
      m.members.push_back(member(x->id, *x));
    };
    if (a.slot >= 0) {
      for (int h : placement_[static_cast<size_t>(a.slot)]) {
        if (AgentInfo* x = SlotAgent(h)) {
          m.my_holders.push_back(x->id);
          add(x);
        }
      }
      m.held_slots = held_slots_[static_cast<size_t>(a.slot)];
      for (int32_t s : m.held_slots) add(SlotAgent(s));
    }
    ErasureMembership(a, &m, add);
    Deliver(id, MembershipMsg::kType, Encode(m));
  }
}

}  // namespace ftrun
