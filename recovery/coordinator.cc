#include "recovery/coordinator.h"

#include <algorithm>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"

namespace ftrun {

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
      members_(
          {o_.ranks_per_slot, o_.first_rank, o_.world_size, o_.racks, o_.replicas, o_.erasure_data, o_.erasure_parity}),
      rounds_(&members_, members_.replicas(), o_.copy_timeout) {
  o_.replicas = members_.replicas();  // (0 with an erasure code)
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
  if (phase_ != Phase::kRecovering || disk_.awaited()) return;
  for (int s = 0; s < members_.slots(); ++s) {
    AgentInfo* a = members_.SlotAgent(s);
    if (a == nullptr || !a->alive || !a->halted || !a->ready) return;
  }
  BroadcastMembership();
  StartMsg m;
  m.epoch = epoch_;
  m.version = rounds_.committed();
  m.master_addr = members_.SlotAgent(0)->address.substr(0, members_.SlotAgent(0)->address.rfind(':'));
  m.master_port = o_.master_port;
  if (o_.store_address) m.store = o_.store_address();
  for (int s = 0; s < members_.slots(); ++s) Send(members_.SlotAgent(s)->id, m);
  phase_ = Phase::kRunning;
  disk_restore_ = false;
  waiting_since_.reset();
  rounds_.Started(now);
  if (!recoveries_.empty()) recoveries_.back().started = now;
  FTRUN_LOG_INFO("epoch {}: started {} nodes from {}", epoch_, members_.slots(),
                 m.version ? "version " + std::to_string(*m.version) : std::string("scratch"));
}

void Coordinator::MaybeTarget(Time now) {
  if (phase_ != Phase::kRunning || (o_.replicas == 0 && !erasure())) return;
  if (std::optional<uint64_t> v = rounds_.Target(now)) SendAll(ReplicateMsg{epoch_, *v});
}

void Coordinator::MaybeCommit(Time now) {
  const std::optional<uint64_t> v = rounds_.Commit(now);
  if (!v) return;
  missing_.clear();
  dropped_why_.clear();
  rebuild_failed_.clear();
  if (std::optional<uint64_t> above = disk_.Committed(*v)) {
    // The job has a newer version than the one it went back to: the old
    // timeline's files above that one go now (before this commit is written).
    FTRUN_LOG_INFO(
        "version {} committed after going back to version {}: nodes drop their files of the abandoned "
        "versions above it",
        *v, *above);
    SendAll(DropAboveMsg{*above});
  }
  SendAll(CommitMsg{*v, epoch_});  // epoch_: the version's timeline, which every node's disk marker records
}

void Coordinator::WarnIfStalled(Time now) {
  if (phase_ != Phase::kRunning || (o_.replicas == 0 && !erasure())) return;
  if (std::optional<std::string> lag = rounds_.Stalled(now)) FTRUN_LOG_WARN("{}", *lag);
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
  if (phase_ == Phase::kRecovering && !disk_.awaited() && waiting_since_ &&
      now - *waiting_since_ > o_.lost_node_timeout) {
    const std::vector<int> vacant = members_.Vacant();
    if (!vacant.empty()) {
      Stop(last_failure_code_, "node(s) " + JoinNumbers(vacant) + " lost, and no spare or returning agent within " +
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

CoordinatorView Coordinator::View() const {
  CoordinatorView v;
  const char* phases[] = {"forming", "running", "recovering", "stopped"};
  v.phase = phases[static_cast<int>(phase_)];
  v.epoch = epoch_;
  v.committed = rounds_.committed();
  v.replicas = o_.replicas;
  v.restarts = restarts_;
  for (int s = 0; s < members_.slots(); ++s) {
    CoordinatorView::Node n{s, members_.RanksOf(s), members_.Rack(s), std::nullopt, {}};
    if (const AgentInfo* a = members_.SlotAgent(s)) {
      n.agent = a->id;
      n.address = a->address;
    }
    v.nodes.push_back(n);
  }
  for (const auto& [id, a] : members_.agents()) {
    if (a.alive && a.slot < 0) v.spares.push_back({id, a.address});
  }
  v.committed_copies = rounds_.CommittedCopies();
  v.erasure_data = o_.erasure_data;
  v.erasure_parity = o_.erasure_parity;
  for (size_t g = 0; g < members_.groups().size(); ++g) {
    CoordinatorView::Group x{members_.groups()[g], std::nullopt};
    if (v.committed) x.survives = rounds_.GroupMargin(static_cast<int>(g), *v.committed);
    v.groups.push_back(std::move(x));
  }
  v.commits = rounds_.commits();
  v.held_reports = rounds_.held_reports();
  v.last_commit_lag_ms = rounds_.last_commit_lag_ms();
  v.recoveries = recoveries_;
  v.done = done_;
  v.exit_code = exit_code_;
  v.exit_message = exit_message_;
  return v;
}

}  // namespace ftrun
