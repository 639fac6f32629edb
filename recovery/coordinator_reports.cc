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
      if (!decoded(&m) || m.epoch != epoch_ || !rounds_.RoundFailed(m.version)) return;
      FTRUN_LOG_DEBUG("commit round of version {} failed at agent {}: picking a newer version", m.version, from);
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
  rounds_.Held(a.id, m.items, now);
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
  const std::optional<uint64_t> committed = rounds_.committed();
  Stop(0,
       "every rank finished; last committed version " + (committed ? std::to_string(*committed) : std::string("none")));
}

void Coordinator::OnPullFailed(AgentInfo& a, const PullFailedMsg& m, Time now) {
  if (m.epoch != epoch_) return;
  // Every holder it was given failed it: those copies do not count.
  rounds_.NoHolders(m.rank, m.version);
  // A rebuild from the erasure group failed (every choice of fragments): the
  // node counts as lost beyond the code, so the disk decides, or the job stops.
  if (erasure() && a.slot >= 0) rebuild_failed_.insert({a.slot, m.version});
  if (phase_ != Phase::kRecovering) return;
  if (!CheckCoverage(" (last error pulling rank " + std::to_string(m.rank) + ": " + m.message + ")")) return;
  if (disk_restore_) return PullAllFromDisk(now);  // no live copy left, but the disk has a version
  // Other live copies remain (the agent was given a subset): pull from those.
  const std::optional<uint64_t> committed = rounds_.committed();
  if (a.slot < 0 || !committed) return;
  PullMsg p{epoch_, *committed, {}};
  auto h = rounds_.HoldersAlive(m.rank, *committed);
  p.ranks.push_back({m.rank, std::vector<uint32_t>(h.begin(), h.end())});
  a.ready = false;
  SendPull(a.id, a.slot, p);
}

}  // namespace ftrun
