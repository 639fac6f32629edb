#include "recovery/coordinator.h"

#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/placement.h"

namespace ftrun {
namespace {

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

constexpr auto kRoundTimeout = std::chrono::seconds(30);

}  // namespace

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
      if (epoch == epoch_) a.halted = true;
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

void Coordinator::Register(PeerId from, const RegisterMsg& m, Time now) {
  if (phase_ == Phase::kStopped) {
    ByteWriter w;
    w.Put<int32_t>(exit_code_);
    w.PutString(exit_message_);
    out_->Send(from, ClusterMsg::kStop, w.data());
    return;
  }
  if (m.slot >= static_cast<int>(slots_.size())) {
    out_->Send(from, ClusterMsg::kFenced, "slot " + std::to_string(m.slot) + " does not exist (the job has " +
                                               std::to_string(slots_.size()) + " nodes)");
    return;
  }
  const bool same_slot = m.slot >= 0 && slots_[static_cast<size_t>(m.slot)] == from;
  if (m.slot >= 0 && slots_[static_cast<size_t>(m.slot)] && *slots_[static_cast<size_t>(m.slot)] != from) {
    PeerId holder = *slots_[static_cast<size_t>(m.slot)];
    FTRUN_LOG_WARN("fenced agent {} at {}: node {} is agent {} now", from, m.address, m.slot, holder);
    out_->Send(from, ClusterMsg::kFenced, "node " + std::to_string(m.slot) + " was given to agent " +
                                              std::to_string(holder) + " while this agent was unreachable");
    return;
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
  for (const auto& [rank, version] : m.catalog) {
    if (committed_ && version == *committed_) held_[version][rank].insert(from);
  }
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
    if (!committed_) RestoreFromDisk();
    return MaybeStart(now);
  }
  if (same_slot) {
    // Same agent, same node, and it was never declared lost: it lost the
    // coordinator for a moment and fenced its own ranks. Resync everyone.
    Assign(a, m.slot);
    return BeginRecovery("agent " + std::to_string(from) + " (node " + std::to_string(m.slot) + ") reconnected", 1, now);
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
        bool has = std::find(m.catalog.begin(), m.catalog.end(), RankVersion{rank, committed_.value_or(0)}) !=
                   m.catalog.end();
        if (committed_ && !has) missing.push_back(rank);
      }
      PullMsg p{epoch_, committed_.value_or(0), {}};
      for (int rank : missing) {
        auto h = HoldersAlive(rank, *committed_);
        p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      }
      if (disk_restore_) p = DiskPull(m.slot);
      BroadcastMembership();
      out_->Send(from, ClusterMsg::kPull, Encode(p));  // it answers kReady, even with nothing to pull
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
  out_->Send(a.id, ClusterMsg::kAssign, Encode(m));
}

void Coordinator::BeginRecovery(const std::string& reason, int exit_code, Time now) {
  if (phase_ == Phase::kStopped) return;
  last_failure_code_ = exit_code == 0 ? 1 : exit_code;
  if (restarts_ >= o_.max_restarts) {
    return Stop(last_failure_code_, "giving up after " + std::to_string(restarts_) + " restarts (job.max_restarts): " + reason);
  }
  restarts_++;
  epoch_++;
  if (committed_) held_.erase(held_.upper_bound(*committed_), held_.end());
  else held_.clear();
  target_.reset();
  ahead_ = false;
  recoveries_.push_back({epoch_, reason, now, std::nullopt});
  FTRUN_LOG_WARN("epoch {}: {}; restoring {}", epoch_, reason,
                 committed_ ? "version " + std::to_string(*committed_) : std::string("nothing (no committed version)"));
  phase_ = Phase::kRecovering;
  for (auto& [id, a] : agents_) {
    a.halted = a.slot < 0;
    a.ready = true;
    a.done = false;
    if (a.alive && a.slot >= 0) out_->Send(id, ClusterMsg::kHalt, EncodeU64(epoch_));
  }
  if (!CheckCoverage("")) return;
  // A node's agent that lacks its own shards of the committed version (a
  // replacement whose pull this recovery interrupted) pulls them again; or,
  // going back to a version on disk, every node reads its ranks from there.
  bool pulls = false;
  for (auto& [id, a] : agents_) {
    if (!a.alive || a.slot < 0 || !committed_) continue;
    if (disk_restore_) {
      a.ready = false;
      out_->Send(id, ClusterMsg::kPull, Encode(DiskPull(a.slot)));
      continue;
    }
    PullMsg p{epoch_, *committed_, {}};
    for (int rank : SlotRanks(a.slot)) {
      auto h = HoldersAlive(rank, *committed_);
      if (std::find(h.begin(), h.end(), id) != h.end()) continue;
      p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
    }
    if (p.ranks.empty()) continue;
    if (!pulls) BroadcastMembership();
    pulls = true;
    a.ready = false;
    out_->Send(id, ClusterMsg::kPull, Encode(p));
  }
  waiting_since_ = now;
  AssignReplacements(now);
  MaybeStart(now);
}

// No agent holds a committed version: start from the newest one complete in
// the persist directory, if any. Every node reads its own ranks from disk
// (a pull with no holders) and answers kHeld, then kReady.
std::optional<uint64_t> Coordinator::DiskVersion() const {
  if (!o_.disk_versions) return std::nullopt;
  for (uint64_t v : o_.disk_versions()) {
    if (!bad_disk_versions_.count(v)) return v;
  }
  return std::nullopt;
}

// A node could not read its ranks of `version` (a chunk that fails its hash,
// a missing file): every node goes to the next older version on disk.
void Coordinator::DiskFailed(PeerId from, uint64_t version, const std::string& why, Time now) {
  if (phase_ != Phase::kRecovering || !committed_ || *committed_ != version) return;
  bad_disk_versions_.insert(version);
  std::optional<uint64_t> older = DiskVersion();
  if (!older) {
    return Stop(1, "agent " + std::to_string(from) + ": " + why + "; no older complete version on disk");
  }
  FTRUN_LOG_WARN("agent {}: {}; going back to version {}, the next older one on disk (version {} is kept on disk "
                 "until a newer version commits)", from, why, *older, version);
  committed_ = older;
  WentBackTo(*older);
  held_.clear();
  disk_restore_ = true;
  PullAllFromDisk(now);
}

void Coordinator::PullAllFromDisk(Time now) {
  epoch_++;  // answers about the abandoned plan (kHeld, kReady) now carry a stale epoch
  for (auto& [id, a] : agents_) {
    if (!a.alive || a.slot < 0) continue;
    a.ready = false;
    out_->Send(id, ClusterMsg::kPull, Encode(DiskPull(a.slot)));
  }
  MaybeStart(now);
}

void Coordinator::WentBackTo(uint64_t version) {
  void_above_ = void_above_ ? std::min(*void_above_, version) : version;
}

void Coordinator::RestoreFromDisk() {
  std::optional<uint64_t> v = DiskVersion();
  if (!v) return;
  committed_ = v;
  WentBackTo(*v);  // what lies above it (incomplete, unreadable) is void once a newer version commits
  FTRUN_LOG_WARN("no committed version in any agent's RAM: restoring version {} from the persist directory", *v);
  for (auto& [id, a] : agents_) {
    if (!a.alive || a.slot < 0) continue;
    a.ready = false;
    out_->Send(id, ClusterMsg::kPull, Encode(DiskPull(a.slot)));
  }
}

PullMsg Coordinator::DiskPull(int slot) const {
  PullMsg p{epoch_, committed_.value_or(0), {}, true};
  for (int rank : SlotRanks(slot)) p.ranks.push_back({rank, {}});
  return p;
}

bool Coordinator::CheckCoverage(const std::string& detail) {
  if (!committed_) return true;
  std::vector<int> uncovered;  // (a replacement still pulling holds nothing yet)
  for (int rank = 0; rank < WorldSize(); ++rank) {
    if (HoldersAlive(rank, *committed_).empty()) uncovered.push_back(rank);
  }
  if (uncovered.empty()) return true;
  if (std::optional<uint64_t> d = DiskVersion()) {
    FTRUN_LOG_WARN("ranks {} have no complete copy of committed version {} on any live node: going back to version "
                   "{}, the newest complete in the persist directory ({} steps lost)",
                   Join(uncovered), *committed_, *d, *committed_ - std::min(*committed_, *d));
    committed_ = d;
    WentBackTo(*d);
    held_.clear();
    disk_restore_ = true;
    return true;
  }
  Stop(1, "ranks " + Join(uncovered) + " have no complete copy of committed version " + std::to_string(*committed_) +
              " on any live node (cluster.replicas: " + std::to_string(o_.replicas) +
              "; more nodes were lost than that covers)" + detail);
  return false;
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
      FTRUN_LOG_WARN("node {} has no agent and there is no spare: waiting up to {} ms (cluster.lost_node_timeout) "
                     "for its agent to come back", s, o_.lost_node_timeout.count());
      return;
    }
    FTRUN_LOG_INFO("spare agent {} takes over node {}", spare->id, s);
    Assign(*spare, static_cast<int>(s));
    spare->halted = true;
    spare->ready = false;
    BroadcastMembership();
    if (disk_restore_) {
      out_->Send(spare->id, ClusterMsg::kPull, Encode(DiskPull(static_cast<int>(s))));
    } else {
      PullMsg p{epoch_, committed_.value_or(0), {}};
      for (int rank : SlotRanks(static_cast<int>(s))) {
        auto h = HoldersAlive(rank, committed_.value_or(0));
        // Spread the pulls: start each rank at a different holder.
        if (!h.empty()) std::rotate(h.begin(), h.begin() + (rank % static_cast<int>(h.size())), h.end());
        if (committed_) p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
      }
      out_->Send(spare->id, ClusterMsg::kPull, Encode(p));  // answered by kReady
    }
  }
}

void Coordinator::MaybeStart(Time now) {
  if (phase_ != Phase::kRecovering) return;
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

void Coordinator::BroadcastMembership() {
  MembershipMsg m;
  m.epoch = epoch_;
  for (auto& [id, a] : agents_) {
    if (a.alive) m.members.push_back({id, a.slot, a.address});
  }
  for (auto& [id, a] : agents_) {
    if (!a.alive) continue;
    m.my_holders.clear();
    if (a.slot >= 0) {
      for (int h : placement_[static_cast<size_t>(a.slot)]) {
        if (AgentInfo* x = SlotAgent(h)) m.my_holders.push_back(x->id);
      }
    }
    out_->Send(id, ClusterMsg::kMembership, Encode(m));
  }
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

// An agent dropped copies (a chunk of theirs was corrupted in its shared
// memory). They no longer count; if a restart is being planned and the agent
// lacks its own ranks of the committed version now, it pulls them first
// (a restart not planned yet does that in BeginRecovery).
void Coordinator::Dropped(AgentInfo& a, const std::vector<RankVersion>& lost, Time now) {
  for (const auto& [rank, version] : lost) {
    auto v = held_.find(version);
    if (v == held_.end()) continue;
    auto h = v->second.find(rank);
    if (h != v->second.end()) h->second.erase(a.id);
  }
  FTRUN_LOG_WARN("agent {} dropped {} snapshot(s) that use a chunk corrupted in its shared memory", a.id, lost.size());
  if (phase_ != Phase::kRecovering || a.slot < 0 || !committed_ || disk_restore_) return;
  PullMsg p{epoch_, *committed_, {}};
  for (int rank : SlotRanks(a.slot)) {
    auto h = HoldersAlive(rank, *committed_);
    if (std::find(h.begin(), h.end(), a.id) == h.end()) p.ranks.push_back({rank, std::vector<uint32_t>(h.begin(), h.end())});
  }
  if (p.ranks.empty() || !CheckCoverage("")) return;
  if (disk_restore_) {  // no live copy left: every node goes back to the disk version
    for (auto& [id, x] : agents_) {
      if (!x.alive || x.slot < 0) continue;
      x.ready = false;
      out_->Send(id, ClusterMsg::kPull, Encode(DiskPull(x.slot)));
    }
    return MaybeStart(now);
  }
  a.ready = false;
  BroadcastMembership();
  out_->Send(a.id, ClusterMsg::kPull, Encode(p));
}

// An agent told to start from the committed version does not hold its own
// ranks of it (it did not start them: each would fail its restore, and so
// would every restart after it). Those copies no longer count, whatever the
// epoch; a report of this epoch starts a recovery in which the agent pulls
// them from their holders (or the job goes back to the disk, or stops when
// no copy is left). The same report again, after such a pull, stops the job
// with an error rather than restart it in a loop.
void Coordinator::Missing(AgentInfo& a, uint64_t epoch, const std::vector<RankVersion>& lost, Time now) {
  std::vector<int> ranks;
  bool again = false;
  for (const auto& [rank, version] : lost) {
    auto v = held_.find(version);
    if (v != held_.end()) {
      auto h = v->second.find(rank);
      if (h != v->second.end()) h->second.erase(a.id);
    }
    if (epoch != epoch_ || !committed_ || version != *committed_) continue;  // a newer start checks again
    // Reported before: a recovery since had it pulled (the agent answers
    // ready only once it holds it), yet it lacks it again.
    again |= missing_.count({a.id, rank, version}) > 0;
    ranks.push_back(rank);
  }
  if (ranks.empty() || phase_ != Phase::kRunning || a.slot < 0) return;
  const std::string what = "node " + std::to_string(a.slot) + " (agent " + std::to_string(a.id) +
                           ") has no copy of rank(s) " + Join(ranks) + " of committed version " +
                           std::to_string(*committed_) + " to restore";
  if (again) {
    return Stop(1, what + ", again after pulling it: stopping rather than restarting the job in a loop");
  }
  const uint64_t version = *committed_;
  const PeerId agent = a.id;
  BeginRecovery(what + "; it pulls them from their holders", 1, now);
  for (int rank : ranks) missing_.insert({agent, rank, version});
}

void Coordinator::OnPeerDown(PeerId peer, const std::string& why, Time now) { Lost(peer, why, now); }

void Coordinator::Lost(PeerId peer, const std::string& why, Time now) {
  auto it = agents_.find(peer);
  if (it == agents_.end() || !it->second.alive) return;
  AgentInfo& a = it->second;
  a.alive = false;
  out_->Disconnect(peer);
  if (phase_ == Phase::kStopped) return;  // agents leave at the end
  int slot = a.slot;
  a.slot = -1;
  FTRUN_LOG_ERROR("agent {} ({}) lost: {}", peer, slot >= 0 ? "node " + std::to_string(slot) : std::string("spare"), why);
  if (slot < 0 || phase_ == Phase::kStopped) return;
  slots_[static_cast<size_t>(slot)].reset();
  if (phase_ == Phase::kForming) return;
  BeginRecovery("node " + std::to_string(slot) + " (agent " + std::to_string(peer) + ") lost: " + why, 1, now);
}

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
  if (phase_ == Phase::kRecovering && waiting_since_ && now - *waiting_since_ > o_.lost_node_timeout) {
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

// Replication must never stop in silence: no commit for 3 x copy_timeout
// while ranks save newer versions names what lags (each rank whose round
// version is not held at redundancy, and its holders that lack it).
void Coordinator::WarnIfStalled(Time now) {
  if (phase_ != Phase::kRunning || o_.replicas == 0) return;
  const auto limit = 3 * o_.copy_timeout;
  if (now - last_commit_ <= limit || now - stall_warned_ <= limit) return;
  if (held_.empty() || (committed_ && held_.rbegin()->first <= *committed_)) return;  // no newer save
  stall_warned_ = now;
  const uint64_t newest = held_.rbegin()->first;
  const uint64_t v = target_.value_or(newest);
  const int need = 1 + o_.replicas;
  std::string lag;
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (int rank : SlotRanks(static_cast<int>(s))) {
      auto h = HoldersAlive(rank, v);
      if (static_cast<int>(h.size()) >= need) continue;
      std::vector<int> missing;  // agents that should hold it and do not
      std::vector<PeerId> want;
      if (slots_[s]) want.push_back(*slots_[s]);
      for (int hs : placement_[s]) {
        if (slots_[static_cast<size_t>(hs)]) want.push_back(*slots_[static_cast<size_t>(hs)]);
      }
      for (PeerId p : want) {
        if (std::find(h.begin(), h.end(), p) == h.end()) missing.push_back(static_cast<int>(p));
      }
      lag += (lag.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " held by " +
             std::to_string(h.size()) + " of " + std::to_string(need) +
             (missing.empty() ? std::string() : " (not by agent(s) " + Join(missing) + ")");
    }
  }
  FTRUN_LOG_WARN("no version committed for {:.0f} ms (3 x cluster.copy_timeout) while ranks save newer ones: last "
                 "committed {}, round version {}, newest saved {}; lagging: {}",
                 Ms(now - last_commit_), committed_ ? std::to_string(*committed_) : std::string("none"),
                 target_ ? std::to_string(*target_) : std::string("none"), newest,
                 lag.empty() ? std::string("none held short (every rank's round copy is in; the commit waits)") : lag);
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

nlohmann::json Coordinator::StatusJson(Time now) const {
  using nlohmann::json;
  json j;
  const char* phases[] = {"forming", "running", "recovering", "stopped"};
  j["phase"] = phases[static_cast<int>(phase_)];
  j["epoch"] = epoch_;
  j["committed_version"] = committed_ ? json(*committed_) : json(nullptr);
  j["replicas"] = o_.replicas;
  j["restarts"] = restarts_;
  j["nodes"] = json::array();
  for (size_t s = 0; s < slots_.size(); ++s) {
    json n = {{"node", s}, {"ranks", o_.ranks_per_slot[s]}, {"rack", o_.racks[s]}};
    n["agent"] = slots_[s] ? json(*slots_[s]) : json(nullptr);
    if (slots_[s]) n["address"] = agents_.at(*slots_[s]).address;
    j["nodes"].push_back(n);
  }
  j["spares"] = json::array();
  for (const auto& [id, a] : agents_) {
    if (a.alive && a.slot < 0) j["spares"].push_back({{"agent", id}, {"address", a.address}});
  }
  // Live copies of the committed version per rank (the rank's own node
  // included): 1 + replicas when the redundancy is whole.
  if (committed_) {
    json copies = json::array();
    auto v = held_.find(*committed_);
    int total = 0;
    for (int n : o_.ranks_per_slot) total += n;
    for (int r = 0; r < total; ++r) {
      int live = 0;
      if (v != held_.end() && v->second.count(r)) {
        for (PeerId a : v->second.at(r)) live += agents_.count(a) && agents_.at(a).alive ? 1 : 0;
      }
      copies.push_back(live);
    }
    j["committed_copies"] = copies;
  }
  j["recoveries"] = json::array();
  for (const auto& r : recoveries_) {
    json x = {{"epoch", r.epoch}, {"reason", r.reason}};
    x["detect_to_start_ms"] = r.started ? json(Ms(*r.started - r.detected)) : json(nullptr);
    x["detected_mono_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(r.detected.time_since_epoch()).count();
    if (r.started) {
      x["started_mono_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(r.started->time_since_epoch()).count();
    }
    j["recoveries"].push_back(x);
  }
  if (done_) {
    j["exit_code"] = exit_code_;
    j["exit_message"] = exit_message_;
  }
  (void)now;
  return j;
}

}  // namespace ftrun
