// ClusterMember: reaching the coordinator, the reports, and the transport's
// events. (The orders are decoded and carried out in cluster_orders.cc.)
#include "launcher/agent/cluster_member.h"

#include <algorithm>

#include "plugin/common/log.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun {

ClusterMember::ClusterMember(Options o, SnapshotStore* store, char* arena_base, VersionRetention* retention,
                             std::function<std::vector<int>()> ranks, Orders* orders, const Clock& clock)
    : o_(std::move(o)),
      store_(store),
      arena_base_(arena_base),
      retention_(retention),
      ranks_(std::move(ranks)),
      orders_(orders),
      clock_(clock) {}

ClusterMember::~ClusterMember() = default;

Status ClusterMember::Setup() {
  if (remote()) return SetupRemote();
  local_ = std::make_unique<LocalCoordinator>(o_.local, static_cast<PeerId>(o_.agent_id));
  Register();
  return Status::Ok();
}

int ClusterMember::event_fd() const { return transport_ ? transport_->event_fd() : -1; }

Status ClusterMember::SetupRemote() {
  UcxTransportOptions t;
  t.self = static_cast<PeerId>(o_.agent_id);
  t.listen_ip = o_.listen_ip;
  FTRUN_RETURN_IF_ERROR(ReadSecretFile(o_.secret_file, &t.secret));
  FTRUN_RETURN_IF_ERROR(CreateUcxTransport(t, &transport_));
  peers_ = std::make_unique<PeerAddresses>(transport_.get());
  replicator_ = std::make_unique<Replicator>(transport_.get(), store_, arena_base_, o_.chunk_size, clock_);
  replicator_->on_stored = [this](int rank, uint64_t version) { held_.push_back({rank, version}); };
  replicator_->on_pulled = [this](uint64_t pull, PeerId from, int rank, uint64_t version, const Status& s) {
    pulls_->Ended(pull, from, rank, version, s);
  };
  pulls_ = std::make_unique<ShardPulls>(clock_, o_.cluster.lost_node_timeout,
                                        [this](PeerId holder, int rank, uint64_t version) {
                                          peers_->Connect(holder);
                                          return replicator_->Pull(holder, rank, version);
                                        });
  pulls_->on_ready = [this](uint64_t epoch) { Report(ReadyMsg{epoch}); };
  pulls_->on_failed = [this](const PullFailedMsg& m) { Report(m); };
  pulls_->on_pulled = [this](int rank, uint64_t version, PeerId from) { orders_->ShardPulled(rank, version, from); };
  auto round_failed = [this](uint64_t version) { Report(RoundFailedMsg{epoch_, version}); };
  replicator_->on_copy_failed = [round_failed](int, uint64_t version, const Status&) { round_failed(version); };
  round_ = std::make_unique<CommitRound>(
      store_,
      [this](int rank, uint64_t version) {
        if (erasure_->enabled())
          erasure_->Saved(rank, version);
        else
          replicator_->Saved(rank, version);
      },
      round_failed);
  SetupErasure();
  // A chunk it was to send is corrupted in our shared memory: as a rank's
  // report, settled at once.
  replicator_->on_corrupt = [this](int rank, uint64_t version, const ChunkRef& c) {
    orders_->CorruptToSend(rank, version, c);
  };
  replicator_->SetCopyTimeout(o_.cluster.copy_timeout);
  // A stalled copy was cancelled: the connection with that agent is reset.
  replicator_->on_stalled = [this](PeerId peer) { peers_->Reset(peer); };
  CoordinatorLink::Options lo;
  lo.peer = kCoordinatorPeer;
  lo.address = o_.coordinator;
  lo.heartbeat_interval = o_.cluster.heartbeat_interval;
  lo.heartbeat_misses = o_.cluster.heartbeat_misses;
  lo.lost_node_timeout = o_.cluster.lost_node_timeout;
  link_ = std::make_unique<CoordinatorLink>(transport_.get(), lo, clock_);
  link_->on_up = [this] {
    FTRUN_LOG_INFO("connected to the coordinator at {}", link_->address());
    Register();
  };
  link_->on_heartbeat = [this] { Report(HeartbeatMsg{epoch_}); };
  link_->on_interval = [this] {
    peers_->Connect(replicator_->holders());  // one that failed (or was reset) is made again
  };
  link_->on_lost = [this](const std::string& why) { orders_->Lost(why); };
  link_->on_give_up = [this] { orders_->GaveUp(); };
  link_->Connect();
  if (UsesEtcd(o_.leader)) {
    watch_ = std::make_unique<LeaderWatch>(o_.leader, o_.job_id, o_.cluster.heartbeat_interval,
                                           std::max(o_.cluster.heartbeat_interval, o_.leader.etcd_lease_ttl / 2));
  }
  FTRUN_LOG_INFO("agent {} listening for peers at {}; coordinator {}", o_.agent_id, transport_->address(),
                 o_.coordinator);
  return Status::Ok();
}

void ClusterMember::SetupErasure() {
  erasure_ = std::make_unique<ErasureMember>(
      transport_.get(), store_, arena_base_, peers_.get(), ranks_, [this] { return retention_->committed(); }, clock_);
  erasure_->on_parity_held = [this](uint64_t version) { Report(ParityHeldMsg{epoch_, version}); };
  erasure_->on_round_failed = [this](uint64_t version) { Report(RoundFailedMsg{epoch_, version}); };
  erasure_->on_rebuilt = [this](uint64_t epoch, uint64_t version, const std::vector<int>& ranks) {
    if (epoch != epoch_) return;
    HeldMsg held{epoch, {}};
    for (int r : ranks) held.items.push_back({r, version});
    Report(held);
    if (pulls_->idle()) Report(ReadyMsg{epoch});
  };
  erasure_->on_rebuild_failed = [this](const PullFailedMsg& m) {
    if (m.epoch == epoch_) Report(m);
  };
}

void ClusterMember::Register() {
  RegisterMsg m = orders_->Registration();
  if (transport_) m.address = transport_->address();
  m.epoch = epoch_;
  // A new coordinator (etcd failover, --attach) learns the parity that
  // covers the committed version, as it learns the copies (the catalog).
  if (const ParityExchange* x = erasure_ ? erasure_->exchange() : nullptr;
      x && m.committed && x->rows().Complete(*m.committed))
    m.parity = m.committed;
  Report(m);
}

void ClusterMember::Events(const std::function<bool()>& done) {
  if (!transport_) return;
  auto now = clock_.Now();
  for (TransportEvent& e : transport_->Poll()) {
    const bool coord = e.peer == kCoordinatorPeer;
    switch (e.kind) {
      case TransportEvent::Kind::kPeerUp:
        if (coord) link_->PeerUp();
        break;
      case TransportEvent::Kind::kPeerDown:
        if (coord) {
          link_->PeerDown(e.status.message());
        } else {
          FTRUN_LOG_WARN("agent {} down: {}", e.peer, e.status.message());
          replicator_->PeerDown(e.peer);
          erasure_->PeerDown(e.peer);
        }
        break;
      case TransportEvent::Kind::kMessage:
        if (coord) {
          if (watch_ && !Current(&e.payload)) break;
          link_->Heard();
          OnOrder(e.type, e.payload);
          orders_->Heard(now);
        } else if (!erasure_->Handle(e.peer, e.type, e.payload) && !replicator_->Handle(e.peer, e.type, e.payload)) {
          FTRUN_LOG_WARN("agent {} sent an unexpected {}", e.peer, ClusterMsgName(e.type));
        }
        break;
      case TransportEvent::Kind::kBulkDone:
        if (!erasure_->BulkDone(e.token, e.status)) replicator_->BulkDone(e.token, e.status);
        break;
    }
    if (done()) return;
  }
}

void ClusterMember::Pump() {
  if (!local_) return;
  local_->Pump([this](uint16_t type, const std::string& payload) { OnOrder(type, payload); }, clock_.Now());
}

void ClusterMember::Tick(Clock::Time now) {
  if (local_) return local_->Tick(now);
  pulls_->Tick(now);       // a plan that never ends is the coordinator's to decide
  replicator_->Tick(now);  // cancels copies that stalled (cluster.copy_timeout)
  erasure_->Tick(now);
  if (watch_) {
    watch_->Connected(link_->up());
    if (auto l = watch_->Newer(term_)) {
      term_ = l->term;
      link_->Retarget(l->address, "etcd names it the job's coordinator, term " + std::to_string(l->term));
    }
  }
  link_->Tick(now);  // heartbeats, silence, reconnecting, giving up
}

// An order of the newest term: its term taken off. One of an older term (a
// deposed coordinator's, still in flight) is dropped.
bool ClusterMember::Current(std::string* payload) {
  int64_t term = 0;
  if (!TakeTerm(payload, &term)) {
    FTRUN_LOG_WARN("a coordinator message too short to carry its term: dropped");
    return false;
  }
  if (term < term_) {
    if (term != dropped_term_)
      FTRUN_LOG_WARN("orders of coordinator term {} dropped: term {} leads the job", term, term_);
    dropped_term_ = term;
    return false;
  }
  term_ = term;
  return true;
}

void ClusterMember::DiskScanned(const Status& scan, std::vector<uint64_t> newest_first, Clock::Time now) {
  if (local_) local_->DiskScanned(scan, std::move(newest_first), now);
}

void ClusterMember::FlushHeld() {
  if (held_.empty()) return;
  Report(HeldMsg{epoch_, std::move(held_)});
  held_.clear();
}

void ClusterMember::Send(ClusterMsg type, const std::string& payload) {
  if (type != ClusterMsg::kHeld) FlushHeld();
  if (local_)
    local_->Report(type, payload);
  else if (link_ && link_->up()) {
    transport_->Send(kCoordinatorPeer, static_cast<uint16_t>(type), payload);
    link_->Sent(clock_.Now());
  }
}

void ClusterMember::RankSaved(int rank, uint64_t version) {
  held_.push_back({rank, version});  // replication waits for the round (kReplicate)
  if (round_) round_->Saved(rank, version);
  retention_->Saved(version, ranks_(), round_ ? round_->version() : std::nullopt);  // bounded while it runs
}

void ClusterMember::JoinEpoch(uint64_t epoch) {
  if (epoch > epoch_) FlushHeld();  // (the old epoch's: the coordinator ignores them)
  epoch_ = std::max(epoch_, epoch);
  if (replicator_) replicator_->SetEpoch(epoch_);
  if (erasure_) erasure_->SetEpoch(epoch_);
}

void ClusterMember::EndRound() {
  if (round_) round_->End();
}

std::optional<AgentView::Cluster> ClusterMember::View() const {
  if (!remote()) return std::nullopt;
  AgentView::Cluster c;
  c.agent = o_.agent_id;
  c.epoch = epoch_;
  c.coordinator_connected = up();
  c.holders = replicator_->holders();
  c.address = transport_->address();
  c.transport = transport_->stats();
  c.replication = replicator_->history();
  if (const ParityExchange* x = erasure_->exchange()) {
    const std::optional<uint64_t> v = x->rows().NewestComplete();
    c.parity_bytes = v ? x->rows().VersionBytes(*v) : 0;
    c.parity_total_bytes = x->rows().memory_bytes();
    c.parity = x->history();
  }
  return c;
}

}  // namespace ftrun
