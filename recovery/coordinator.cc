#include "recovery/coordinator.h"

#include <algorithm>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "recovery/placement.h"

namespace ftrun {
namespace {

constexpr auto kRoundTimeout = std::chrono::seconds(30);

}  // namespace

std::string Coordinator::Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

Coordinator::Coordinator(Options options, Outbox* out)
    : o_(std::move(options)), out_(out), slots_(o_.ranks_per_slot.size()) {
  o_.racks.resize(o_.ranks_per_slot.size());
  placement_ = PlaceReplicas(o_.racks, o_.replicas);
}

int Coordinator::FirstRank(int slot) const {
  int r = 0;
  for (int i = 0; i < slot; ++i) r += o_.ranks_per_slot[static_cast<size_t>(i)];
  return r;
}

int Coordinator::WorldSize() const { return FirstRank(static_cast<int>(o_.ranks_per_slot.size())); }

std::vector<int> Coordinator::SlotRanks(int slot) const {
  std::vector<int> v;
  for (int i = 0; i < o_.ranks_per_slot[static_cast<size_t>(slot)]; ++i) v.push_back(FirstRank(slot) + i);
  return v;
}

Coordinator::AgentInfo* Coordinator::SlotAgent(int slot) {
  auto& id = slots_[static_cast<size_t>(slot)];
  return id ? &agents_.at(*id) : nullptr;
}

std::vector<PeerId> Coordinator::HoldersAlive(int rank, uint64_t version) const {
  std::vector<PeerId> v;
  auto it = held_.find(version);
  if (it == held_.end()) return v;
  auto jt = it->second.find(rank);
  if (jt == it->second.end()) return v;
  for (PeerId p : jt->second) {
    auto a = agents_.find(p);
    if (a != agents_.end() && a->second.alive) v.push_back(p);
  }
  return v;
}

void Coordinator::SendAll(ClusterMsg type, const std::string& payload) {
  for (auto& [id, a] : agents_) {
    if (a.alive) out_->Send(id, type, payload);
  }
}

void Coordinator::OnMessage(PeerId from, uint16_t type, const std::string& payload, Time now) {
  ByteReader r(payload);
  auto it = agents_.find(from);
  if (static_cast<ClusterMsg>(type) == ClusterMsg::kRegister) {
    RegisterMsg m;
    Status s = Decode(payload, &m);
    if (!s.ok()) {
      FTRUN_LOG_WARN("agent {}: {}", from, s.message());
      return;
    }
    return Register(from, m, now);
  }
  if (it == agents_.end() || !it->second.alive) return;  // not registered (or declared lost): ignored
  AgentInfo& a = it->second;
  a.last_heard = now;
  uint64_t epoch = r.Get<uint64_t>();
  if (!r.ok()) {  // every message after kRegister starts with the sender's epoch
    FTRUN_LOG_WARN("agent {} sent a {} of {} bytes, without its epoch: ignored", from, ClusterMsgName(type),
                   payload.size());
    return;
  }
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kHeartbeat: return;
    case ClusterMsg::kHeld:
      if (epoch != epoch_) return;  // a stopped generation's saves never count
      for (const auto& [rank, version] : GetRankVersions(&r)) {
        if (r.ok() && (!committed_ || version >= *committed_)) held_[version][rank].insert(from);
        if (r.ok() && target_ == version) target_since_ = now;  // the round makes progress
      }
      MaybeCommit(now);
      return MaybeTarget(now);
    case ClusterMsg::kRankFailed: {
      int32_t code = r.Get<int32_t>();
      std::string reason = r.GetString();
      bool early = r.Get<uint8_t>() != 0;  // before the rank's first save (EarlyFailureRule)
      if (!r.ok() || epoch != epoch_ || phase_ != Phase::kRunning) return;
      if (early_failures_.Record(epoch_, early, code)) {
        return Stop(code == 0 ? 1 : code, "not restarting: the same failure before the first save in two epochs in a "
                                          "row (exit code " + std::to_string(code) + "), so every restart would end "
                                          "the same way: " + reason);
      }
      BeginRecovery(reason, code, now);
      return;
    }
    case ClusterMsg::kHalted:
      if (epoch >= halt_epoch_ && epoch <= epoch_) a.halted = true;
      return MaybeStart(now);
    case ClusterMsg::kReady:
      if (epoch == epoch_) a.ready = true;
      return MaybeStart(now);
    case ClusterMsg::kNodeDone: {
      if (epoch != epoch_ || a.slot < 0) return;
      a.done = true;
      bool all = true;
      for (size_t i = 0; i < slots_.size(); ++i) all &= SlotAgent(static_cast<int>(i)) && SlotAgent(static_cast<int>(i))->done;
      if (all) {
        Stop(0, "every rank finished; last committed version " +
                    (committed_ ? std::to_string(*committed_) : std::string("none")));
      }
      return;
    }
    case ClusterMsg::kRoundFailed: {
      uint64_t v = r.Get<uint64_t>();
      if (epoch != epoch_ || !r.ok() || target_ != v) return;
      FTRUN_LOG_DEBUG("commit round of version {} failed at agent {}: picking a newer version", v, from);
      held_.erase(v);
      target_.reset();
      ahead_ = true;
      return MaybeTarget(now);
    }
    case ClusterMsg::kPullFailed: {
      int32_t rank = r.Get<int32_t>();
      uint64_t version = r.Get<uint64_t>();
      std::string msg = r.GetString();
      if (!r.ok() || epoch != epoch_) return;
      // Every holder it was given failed it: those copies do not count.
      auto v = held_.find(version);
      if (v != held_.end()) v->second.erase(rank);
      if (phase_ != Phase::kRecovering) return;
      if (!CheckCoverage(" (last error pulling rank " + std::to_string(rank) + ": " + msg + ")")) return;
      if (disk_restore_) {  // no live copy left, but the disk has a version: every node goes back to it
        FTRUN_LOG_WARN("agent {} could not pull rank {} ({}): every node restores version {} from disk", from, rank,
                       msg, committed_.value_or(0));
        return PullAllFromDisk(now);
      }
      // Other live copies remain (the agent was given a subset): pull from those.
      if (a.slot < 0 || !committed_) return;
      PullMsg p{epoch_, *committed_, {}};
      auto h = HoldersAlive(rank, *committed_);
      p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      a.ready = false;
      out_->Send(from, ClusterMsg::kPull, Encode(p));
      return;
    }
    case ClusterMsg::kDiskFailed: {
      uint64_t version = r.Get<uint64_t>();
      std::string msg = r.GetString();
      if (epoch == epoch_ && r.ok()) DiskFailed(from, version, msg, now);
      return;
    }
    case ClusterMsg::kDropped: {
      // Whatever the epoch: those copies are gone.
      auto lost = GetRankVersions(&r);
      if (r.ok()) Dropped(a, lost, now);
      return;
    }
    case ClusterMsg::kMissing: {
      auto lost = GetRankVersions(&r);
      if (r.ok()) Missing(a, epoch, lost, now);
      return;
    }
    case ClusterMsg::kFatal: {
      std::string msg = r.GetString();
      return Stop(1, "agent " + std::to_string(from) + ": " + msg);
    }
    default: FTRUN_LOG_WARN("agent {} sent an unexpected {}", from, ClusterMsgName(type));
  }
}

void Coordinator::MaybeStart(Time now) {
  if (phase_ != Phase::kRecovering || disk_need_ != DiskNeed::kNone) return;
  for (size_t s = 0; s < slots_.size(); ++s) {
    AgentInfo* a = SlotAgent(static_cast<int>(s));
    if (a == nullptr || !a->alive || !a->halted || !a->ready) return;
  }
  BroadcastMembership();
  StartMsg m;
  m.epoch = epoch_;
  m.version = committed_;
  m.master_addr = SlotAgent(0)->address.substr(0, SlotAgent(0)->address.rfind(':'));
  m.master_port = o_.master_port;
  for (size_t s = 0; s < slots_.size(); ++s) out_->Send(SlotAgent(static_cast<int>(s))->id, ClusterMsg::kStart, Encode(m));
  phase_ = Phase::kRunning;
  disk_restore_ = false;
  waiting_since_.reset();
  last_commit_ = stall_warned_ = now;
  if (!recoveries_.empty()) recoveries_.back().started = now;
  FTRUN_LOG_INFO("epoch {}: started {} nodes from {}", epoch_, slots_.size(),
                 committed_ ? "version " + std::to_string(*committed_) : std::string("scratch"));
}

void Coordinator::MaybeTarget(Time now) {
  if (phase_ != Phase::kRunning || o_.replicas == 0) return;
  // A round in progress runs to its end (the first one copies whole
  // shards); only one with no copy of its version held for 3 x
  // cluster.copy_timeout (at most kRoundTimeout: a holder refused the copy,
  // a copy hangs) gives way to a newer version. Tick asks too, so a round
  // that hears nothing still gives way.
  const auto patience = std::min<std::chrono::milliseconds>(kRoundTimeout, 3 * o_.copy_timeout);
  if (target_ && (!committed_ || *target_ > *committed_) && now - target_since_ < patience) return;
  const int world = WorldSize();
  std::optional<uint64_t> newest;
  for (auto it = held_.rbegin(); it != held_.rend() && !newest; ++it) {
    if ((committed_ && it->first <= *committed_) || static_cast<int>(it->second.size()) < world) continue;
    bool all = true;
    for (int r = 0; r < world && all; ++r) all = !HoldersAlive(r, it->first).empty();
    if (all) newest = it->first;
  }
  if (!newest && ahead_ && !held_.empty() && (!committed_ || held_.rbegin()->first > *committed_)) {
    newest = held_.rbegin()->first;  // the fastest rank's; the others copy it when they save it
  }
  if (!newest || newest == target_) return;
  target_ = newest;
  target_since_ = now;
  ByteWriter w;
  w.Put<uint64_t>(epoch_);
  w.Put<uint64_t>(*newest);
  SendAll(ClusterMsg::kReplicate, w.data());
  // Older versions not committed will never be: forget them.
  held_.erase(committed_ ? held_.upper_bound(*committed_) : held_.begin(), held_.lower_bound(*newest));
}

void Coordinator::MaybeCommit(Time now) {
  const int need = 1 + o_.replicas;
  const int world = WorldSize();
  std::optional<uint64_t> newest;
  for (auto& [version, ranks] : held_) {
    if (committed_ && version <= *committed_) continue;
    if (static_cast<int>(ranks.size()) < world) continue;
    bool all = true;
    for (int r = 0; r < world && all; ++r) all = static_cast<int>(HoldersAlive(r, version).size()) >= need;
    if (all) newest = version;
  }
  if (!newest) return;
  committed_ = newest;
  last_commit_ = now;
  held_.erase(held_.begin(), held_.lower_bound(*newest));
  missing_.clear();
  FTRUN_LOG_DEBUG("version {} committed", *newest);
  if (void_above_ && *newest > *void_above_) {
    // The job has a newer version than the one it went back to: the old
    // timeline's files above that one go now (before this commit is written),
    // and version numbers found bad there may be written again, good.
    FTRUN_LOG_INFO("version {} committed after going back to version {}: nodes drop their files of the abandoned "
                   "versions above it", *newest, *void_above_);
    SendAll(ClusterMsg::kDropAbove, EncodeU64(*void_above_));
    void_above_.reset();
    bad_disk_versions_.clear();
  }
  ByteWriter commit;
  commit.Put<uint64_t>(*newest);
  commit.Put<uint64_t>(epoch_);  // the version's timeline: every node's disk marker of it records this
  SendAll(ClusterMsg::kCommit, commit.data());
}

void Coordinator::OnPeerDown(PeerId peer, const std::string& why, Time now) { Lost(peer, why, now); }

void Coordinator::Tick(Time now) {
  if (phase_ == Phase::kStopped) return;
  MaybeTarget(now);  // a round stuck with no progress gives way
  if (now - last_heartbeat_sent_ >= o_.heartbeat_interval) {
    last_heartbeat_sent_ = now;
    SendAll(ClusterMsg::kCoordHeartbeat, EncodeU64(epoch_));
  }
  const auto limit = o_.heartbeat_interval * o_.heartbeat_misses;
  std::vector<PeerId> silent;
  for (auto& [id, a] : agents_) {
    if (a.alive && now - a.last_heard > limit) silent.push_back(id);
  }
  for (PeerId p : silent) {
    Lost(p, "no heartbeat for " + std::to_string(static_cast<long>(Ms(limit))) +
                " ms (cluster.heartbeat_misses x cluster.heartbeat_interval)", now);
  }
  MaybeTarget(now);  // a round that stalled (a refused copy) gives way to a newer one
  WarnIfStalled(now);
  // (A scan of the disk decides first: spares take the places after it.)
  if (phase_ == Phase::kRecovering && disk_need_ == DiskNeed::kNone && waiting_since_ &&
      now - *waiting_since_ > o_.lost_node_timeout) {
    std::vector<int> vacant;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s]) vacant.push_back(static_cast<int>(s));
    }
    if (!vacant.empty()) {
      Stop(last_failure_code_, "node(s) " + Join(vacant) + " lost, and no spare or returning agent within " +
                                   std::to_string(o_.lost_node_timeout.count()) + " ms (cluster.lost_node_timeout)");
    }
  }
}

void Coordinator::Stop(int code, const std::string& message) {
  if (phase_ == Phase::kStopped) return;
  phase_ = Phase::kStopped;
  done_ = true;
  exit_code_ = code;
  exit_message_ = message;
  if (code == 0) FTRUN_LOG_INFO("job ends: {}", message);
  else FTRUN_LOG_ERROR("job stops: {}", message);
  ByteWriter w;
  w.Put<int32_t>(code);
  w.PutString(message);
  SendAll(ClusterMsg::kStop, w.data());
}

}  // namespace ftrun
