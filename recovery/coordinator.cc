#include "recovery/coordinator.h"

#include <algorithm>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"

namespace ftrun {
namespace {

constexpr auto kRoundTimeout = std::chrono::seconds(30);

}  // namespace

std::string Coordinator::Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

Coordinator::Options Coordinator::Options::FromConfig(const Config& c) {
  Options o;
  o.replicas = c.cluster.replicas;
  o.erasure_data = c.cluster.erasure.data;
  o.erasure_parity = c.cluster.erasure.parity;
  o.heartbeat_interval = c.cluster.heartbeat_interval;
  o.heartbeat_misses = c.cluster.heartbeat_misses;
  o.lost_node_timeout = c.cluster.lost_node_timeout;
  o.copy_timeout = c.cluster.copy_timeout;
  o.max_restarts = c.job.max_restarts;
  return o;
}

Coordinator::Coordinator(Options options, Outbox* out)
    : o_(std::move(options)),
      out_(out),
      members_({o_.ranks_per_slot, o_.first_rank, o_.world_size, o_.racks, o_.replicas, o_.erasure_data,
                o_.erasure_parity}) {
  if (erasure()) o_.replicas = 0;  // the code replaces copies
}

std::vector<PeerId> Coordinator::HoldersAlive(int rank, uint64_t version) const {
  std::vector<PeerId> v;
  auto it = held_.find(version);
  if (it == held_.end()) return v;
  auto jt = it->second.find(rank);
  if (jt == it->second.end()) return v;
  for (PeerId p : jt->second) {
    if (members_.Alive(p)) v.push_back(p);
  }
  return v;
}

void Coordinator::Deliver(PeerId to, ClusterMsg type, std::string payload) {
  if (AgentInfo* a = members_.Find(to)) a->last_sent = now_;
  out_->Send(to, type, std::move(payload));
}

void Coordinator::SendAll(ClusterMsg type, const std::string& payload) {
  for (auto& [id, a] : members_.agents()) {
    if (a.alive) Deliver(id, type, payload);
  }
}

void Coordinator::MaybeStart(Time now) {
  if (phase_ != Phase::kRecovering || disk_need_ != DiskNeed::kNone) return;
  for (int s = 0; s < members_.slots(); ++s) {
    AgentInfo* a = members_.SlotAgent(s);
    if (a == nullptr || !a->alive || !a->halted || !a->ready) return;
  }
  BroadcastMembership();
  StartMsg m;
  m.epoch = epoch_;
  m.version = committed_;
  m.master_addr = members_.SlotAgent(0)->address.substr(0, members_.SlotAgent(0)->address.rfind(':'));
  m.master_port = o_.master_port;
  if (o_.store_address) m.store = o_.store_address();
  for (int s = 0; s < members_.slots(); ++s) Send(members_.SlotAgent(s)->id, m);
  phase_ = Phase::kRunning;
  disk_restore_ = false;
  waiting_since_.reset();
  last_commit_ = stall_warned_ = now;
  if (!recoveries_.empty()) recoveries_.back().started = now;
  FTRUN_LOG_INFO("epoch {}: started {} nodes from {}", epoch_, members_.slots(),
                 committed_ ? "version " + std::to_string(*committed_) : std::string("scratch"));
}

void Coordinator::MaybeTarget(Time now) {
  if (phase_ != Phase::kRunning || (o_.replicas == 0 && !erasure())) return;
  // A round in progress runs to its end (the first one copies whole
  // shards); only one with no copy of its version held for 3 x
  // cluster.copy_timeout (at most kRoundTimeout: a holder refused the copy,
  // a copy hangs) gives way to a newer version. Tick asks too, so a round
  // that hears nothing still gives way.
  const auto patience = std::min<std::chrono::milliseconds>(kRoundTimeout, 3 * o_.copy_timeout);
  if (target_ && (!committed_ || *target_ > *committed_) && now - target_since_ < patience) return;
  std::optional<uint64_t> newest;
  for (auto it = held_.rbegin(); it != held_.rend() && !newest; ++it) {
    if ((committed_ && it->first <= *committed_) || static_cast<int>(it->second.size()) < members_.RankCount())
      continue;
    bool all = true;
    for (int r = members_.FirstRank(0); r < members_.EndRank() && all; ++r) all = !HoldersAlive(r, it->first).empty();
    if (all) newest = it->first;
  }
  if (!newest && ahead_ && !held_.empty() && (!committed_ || held_.rbegin()->first > *committed_)) {
    newest = held_.rbegin()->first;  // the fastest rank's; the others copy it when they save it
  }
  if (!newest || newest == target_) return;
  target_ = newest;
  target_since_ = now;
  SendAll(ReplicateMsg{epoch_, *newest});
  // Older versions not committed will never be: forget them.
  held_.erase(committed_ ? held_.upper_bound(*committed_) : held_.begin(), held_.lower_bound(*newest));
}

void Coordinator::MaybeCommit(Time now) {
  const int need = 1 + o_.replicas;
  std::optional<uint64_t> newest;
  const int count = members_.RankCount();
  for (auto& [version, ranks] : held_) {
    if (committed_ && version <= *committed_) continue;
    if (static_cast<int>(ranks.size()) < count) continue;
    if (auto f = filled_.find(version); f == filled_.end() || f->second < count) continue;
    bool all = true;
    for (int r = members_.FirstRank(0); r < members_.EndRank() && all; ++r)
      all = static_cast<int>(HoldersAlive(r, version).size()) >= need;
    if (all && erasure()) all = ParityComplete(version);
    if (all) newest = version;
  }
  if (!newest) return;
  committed_ = newest;
  last_commit_ = now;
  commits_++;
  if (auto since = held_since_.find(*newest); since != held_since_.end()) {
    last_commit_lag_ms_ = std::chrono::duration<double, std::milli>(now - since->second).count();
  }
  held_.erase(held_.begin(), held_.lower_bound(*newest));
  held_since_.erase(held_since_.begin(), held_since_.upper_bound(*newest));
  filled_.erase(filled_.begin(), filled_.upper_bound(*newest));
  parity_held_.erase(parity_held_.begin(), parity_held_.lower_bound(*newest));
  missing_.clear();
  dropped_why_.clear();
  rebuild_failed_.clear();
  FTRUN_LOG_DEBUG("version {} committed", *newest);
  if (void_above_ && *newest > *void_above_) {
    // The job has a newer version than the one it went back to: the old
    // timeline's files above that one go now (before this commit is written),
    // and version numbers found bad there may be written again, good.
    FTRUN_LOG_INFO(
        "version {} committed after going back to version {}: nodes drop their files of the abandoned "
        "versions above it",
        *newest, *void_above_);
    SendAll(DropAboveMsg{*void_above_});
    void_above_.reset();
    bad_disk_versions_.clear();
  }
  SendAll(CommitMsg{*newest, epoch_});  // epoch_: the version's timeline, which every node's disk marker records
}

void Coordinator::OnPeerDown(PeerId peer, const std::string& why, Time now) {
  now_ = now;
  Lost(peer, why, now);
}

void Coordinator::Tick(Time now) {
  now_ = now;
  if (phase_ == Phase::kStopped) return;
  MaybeTarget(now);  // a round stuck with no progress gives way
  // A heartbeat to each agent that was sent nothing for an interval: at
  // thousands of agents the commits and rounds already say the coordinator
  // is there, and heartbeats were most of its messages.
  const std::string beat = Encode(CoordHeartbeatMsg{epoch_});
  for (auto& [id, a] : members_.agents()) {
    if (a.alive && now - a.last_sent >= o_.heartbeat_interval) Deliver(id, ClusterMsg::kCoordHeartbeat, beat);
  }
  const auto limit = o_.heartbeat_interval * o_.heartbeat_misses;
  std::vector<PeerId> silent;
  for (auto& [id, a] : members_.agents()) {
    if (a.alive && o_.heartbeat_misses > 0 && now - a.last_heard > limit) silent.push_back(id);
  }
  for (PeerId p : silent) {
    Lost(p,
         "no heartbeat for " + std::to_string(static_cast<long>(Ms(limit))) +
             " ms (cluster.heartbeat_misses x cluster.heartbeat_interval)",
         now);
  }
  MaybeTarget(now);  // a round that stalled (a refused copy) gives way to a newer one
  WarnIfStalled(now);
  // (A scan of the disk decides first: spares take the places after it.)
  if (phase_ == Phase::kRecovering && disk_need_ == DiskNeed::kNone && waiting_since_ &&
      now - *waiting_since_ > o_.lost_node_timeout) {
    const std::vector<int> vacant = members_.Vacant();
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
  if (code == 0)
    FTRUN_LOG_INFO("job ends: {}", message);
  else
    FTRUN_LOG_ERROR("job stops: {}", message);
  SendAll(StopMsg{code, message});
}

}  // namespace ftrun
