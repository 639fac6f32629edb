// The coordinator's inbox: each agent message decoded into its struct
// (cluster_messages.h), then handled. A message that does not decode is
// ignored with a WARN naming the agent and what was malformed; nothing of it
// is acted on (a truncated report is never read as epoch 0).
#include "plugin/common/log.h"
#include "recovery/coordinator.h"

namespace ftrun {

void Coordinator::OnMessage(PeerId from, uint16_t type, const std::string& payload, Time now) {
  now_ = now;
  auto decoded = [&](auto* m) {
    Status s = Decode(payload, m);
    if (!s.ok()) FTRUN_LOG_WARN("agent {} sent a bad {}: {}; ignored", from, ClusterMsgName(type), s.message());
    return s.ok();
  };
  if (static_cast<ClusterMsg>(type) == ClusterMsg::kRegister) {
    RegisterMsg m;
    if (decoded(&m)) Register(from, m, now);
    return;
  }
  AgentInfo* found = members_.Find(from);
  if (found == nullptr || !found->alive) return;  // not registered (or declared lost): ignored
  AgentInfo& a = *found;
  a.last_heard = now;
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kHeartbeat: {
      HeartbeatMsg m;
      decoded(&m);
      return;
    }
    case ClusterMsg::kHeld: {
      HeldMsg m;
      if (decoded(&m)) OnHeld(a, m, now);
      return;
    }
    case ClusterMsg::kRankFailed: {
      RankFailedMsg m;
      if (decoded(&m)) OnRankFailed(m, now);
      return;
    }
    case ClusterMsg::kHalted: {
      HaltedMsg m;
      if (!decoded(&m)) return;
      if (m.epoch >= halt_epoch_ && m.epoch <= epoch_) a.halted = true;
      return MaybeStart(now);
    }
    case ClusterMsg::kReady: {
      ReadyMsg m;
      if (!decoded(&m)) return;
      if (m.epoch == epoch_) a.ready = true;
      return MaybeStart(now);
    }
    case ClusterMsg::kNodeDone: {
      NodeDoneMsg m;
      if (decoded(&m)) OnNodeDone(a, m);
      return;
    }
    case ClusterMsg::kRoundFailed: {
      RoundFailedMsg m;
      if (!decoded(&m) || m.epoch != epoch_ || target_ != m.version) return;
      FTRUN_LOG_DEBUG("commit round of version {} failed at agent {}: picking a newer version", m.version, from);
      held_.erase(m.version);
      filled_.erase(m.version);
      target_.reset();
      ahead_ = true;
      return MaybeTarget(now);
    }
    case ClusterMsg::kPullFailed: {
      PullFailedMsg m;
      if (decoded(&m)) OnPullFailed(a, m, now);
      return;
    }
    case ClusterMsg::kDiskFailed: {
      DiskFailedMsg m;
      if (decoded(&m) && m.epoch == epoch_) DiskFailed(from, m.version, m.message, now);
      return;
    }
    case ClusterMsg::kDropped: {
      DroppedMsg m;  // whatever the epoch: those copies are gone
      if (decoded(&m)) Dropped(a, m, now);
      return;
    }
    case ClusterMsg::kParityHeld: {
      ParityHeldMsg m;
      if (decoded(&m)) OnParityHeld(a, m, now);
      return;
    }
    case ClusterMsg::kMissing: {
      MissingMsg m;
      if (decoded(&m)) Missing(a, m.epoch, m.items, now);
      return;
    }
    case ClusterMsg::kFatal: {
      FatalMsg m;
      if (decoded(&m)) Stop(m.code == 0 ? 1 : m.code, "agent " + std::to_string(from) + ": " + m.message);
      return;
    }
    default:
      FTRUN_LOG_WARN("agent {} sent an unexpected {}", from, ClusterMsgName(type));
  }
}

void Coordinator::OnHeld(AgentInfo& a, const HeldMsg& m, Time now) {
  if (m.epoch != epoch_) return;  // a stopped generation's saves never count
  held_reports_++;
  for (const auto& [rank, version] : m.items) {
    if (committed_ && version < *committed_) continue;
    auto& ranks = held_[version];
    auto& holders = ranks[rank];
    if (holders.insert(a.id).second && static_cast<int>(holders.size()) == 1 + o_.replicas) filled_[version]++;
    if (static_cast<int>(ranks.size()) >= members_.RankCount())
      held_since_.emplace(version, now);          // every rank saved it
    if (target_ == version) target_since_ = now;  // the round makes progress
  }
  // Bounded while nothing commits: the oldest versions go first (a round's
  // is kept).
  for (auto it = held_.begin(); held_.size() > kMaxHeldVersions && it != held_.end();) {
    if (it->first == target_) {
      ++it;
    } else {
      filled_.erase(it->first);
      it = held_.erase(it);
    }
  }
  while (held_since_.size() > kMaxHeldVersions) held_since_.erase(held_since_.begin());
  MaybeCommit(now);
  MaybeTarget(now);
}

void Coordinator::OnRankFailed(const RankFailedMsg& m, Time now) {
  if (m.epoch != epoch_ || phase_ != Phase::kRunning) return;
  if (early_failures_.Record(epoch_, m.early, m.code)) {
    // (A generation of ranks is an epoch: one node's jobs say generations.)
    return Stop(m.code == 0 ? 1 : m.code,
                "not restarting: the same failure before the first save in two generations "
                "in a row (two epochs in a row, exit code " +
                    std::to_string(m.code) + "), so every restart would end the same way: " + m.reason);
  }
  BeginRecovery(m.reason, m.code, now);
}

void Coordinator::OnNodeDone(AgentInfo& a, const NodeDoneMsg& m) {
  if (m.epoch != epoch_ || a.slot < 0) return;
  a.done = true;
  for (int i = 0; i < members_.slots(); ++i) {
    AgentInfo* x = members_.SlotAgent(i);
    if (x == nullptr || !x->done) return;
  }
  Stop(0, "every rank finished; last committed version " +
              (committed_ ? std::to_string(*committed_) : std::string("none")));
}

void Coordinator::OnPullFailed(AgentInfo& a, const PullFailedMsg& m, Time now) {
  if (m.epoch != epoch_) return;
  // Every holder it was given failed it: those copies do not count.
  auto v = held_.find(m.version);
  if (v != held_.end()) v->second.erase(m.rank);
  // A rebuild from the erasure group failed (every choice of fragments): the
  // node counts as lost beyond the code, so the disk decides, or the job stops.
  if (erasure() && a.slot >= 0) rebuild_failed_.insert({a.slot, m.version});
  if (phase_ != Phase::kRecovering) return;
  if (!CheckCoverage(" (last error pulling rank " + std::to_string(m.rank) + ": " + m.message + ")")) return;
  if (disk_restore_) return PullAllFromDisk(now);  // no live copy left, but the disk has a version
  // Other live copies remain (the agent was given a subset): pull from those.
  if (a.slot < 0 || !committed_) return;
  PullMsg p{epoch_, *committed_, {}};
  auto h = HoldersAlive(m.rank, *committed_);
  p.ranks.push_back({m.rank, std::vector<uint32_t>(h.begin(), h.end())});
  a.ready = false;
  SendPull(a.id, a.slot, p);
}

}  // namespace ftrun
