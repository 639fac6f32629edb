// The agent in a multi-node job: connects to the runner's coordinator over
// UCX, heartbeats, replicates saves to its holders, takes its place in the
// job (assign, membership), and fences its own ranks when it loses the
// coordinator. (Orders are decoded in agent_coordinator.cc.)

#include <algorithm>

#include "launcher/agent/agent.h"
#include "plugin/common/log.h"
#include "plugin/transport/secret.h"
#include "plugin/transport/ucx_transport.h"

namespace ftrun {

Status Agent::SetupCluster() {
  UcxTransportOptions t;
  t.self = static_cast<PeerId>(o_.agent_id);
  t.listen_ip = o_.listen_ip;
  FTRUN_RETURN_IF_ERROR(ReadSecretFile(o_.secret_file, &t.secret));
  FTRUN_RETURN_IF_ERROR(CreateUcxTransport(t, &transport_));
  peers_ = std::make_unique<PeerAddresses>(transport_.get());
  replicator_ =
      std::make_unique<Replicator>(transport_.get(), store_.get(), arena_.base(), o_.config.store.chunk_size, clock_);
  replicator_->on_stored = [this](int rank, uint64_t version) { held_pending_.push_back({rank, version}); };
  replicator_->on_pulled = [this](uint64_t pull, PeerId from, int rank, uint64_t version, const Status& s) {
    pulls_->Ended(pull, from, rank, version, s);
  };
  pulls_ = std::make_unique<ShardPulls>(clock_, o_.config.cluster.lost_node_timeout,
                                        [this](PeerId holder, int rank, uint64_t version) {
                                          peers_->Connect(holder);
                                          return replicator_->Pull(holder, rank, version);
                                        });
  pulls_->on_ready = [this](uint64_t epoch) { Report(ReadyMsg{epoch}); };
  pulls_->on_failed = [this](const PullFailedMsg& m) { Report(m); };
  pulls_->on_pulled = [this](int rank, uint64_t version, PeerId from) {
    corrupt_->Pulled(rank, version, "agent " + std::to_string(from));
  };
  replicator_->on_copy_failed = [this](int, uint64_t version, const Status&) { RoundFailed(version); };
  round_ = std::make_unique<CommitRound>(
      store_.get(), [this](int rank, uint64_t version) { replicator_->Saved(rank, version); },
      [this](uint64_t version) { RoundFailed(version); });
  // A chunk it was to send is corrupted in our shared memory (it did not
  // send it): as a rank's report, settled at once.
  replicator_->on_corrupt = [this](int rank, uint64_t version, const ChunkRef& c) {
    corrupt_->FoundSending(rank, version, c);
    SettleCorruptChunks();
  };
  replicator_->SetCopyTimeout(o_.config.cluster.copy_timeout);
  // A stalled copy was cancelled: the connection with that agent is reset.
  replicator_->on_stalled = [this](PeerId peer) { peers_->Reset(peer); };
  FTRUN_RETURN_IF_ERROR(loop_.Add(transport_->event_fd(), kTransportTag));
  CoordinatorLink::Options lo;
  lo.peer = kCoordinatorPeer;
  lo.address = o_.coordinator;
  lo.heartbeat_interval = o_.config.cluster.heartbeat_interval;
  lo.heartbeat_misses = o_.config.cluster.heartbeat_misses;
  lo.lost_node_timeout = o_.config.cluster.lost_node_timeout;
  link_ = std::make_unique<CoordinatorLink>(transport_.get(), lo, clock_);
  link_->on_up = [this] {
    FTRUN_LOG_INFO("connected to the coordinator at {}", o_.coordinator);
    RegisterWithCoordinator();
  };
  link_->on_heartbeat = [this] {
    Report(HeartbeatMsg{epoch_});
    peers_->Connect(replicator_->holders());  // one that failed (or was reset) is made again
  };
  link_->on_lost = [this](const std::string& why) { CoordinatorLost(why); };
  link_->on_give_up = [this] {
    exit_code_ = 1;
    if (state_ == State::kRunning)
      BeginStop(StopCause::kShutdown, "no coordinator");
    else if (state_ != State::kStopping)
      state_ = State::kDone;
  };
  link_->Connect();
  FTRUN_LOG_INFO("agent {} listening for peers at {}; coordinator {}", o_.agent_id, transport_->address(),
                 o_.coordinator);
  return Status::Ok();
}

void Agent::TransportEvents() {
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
        }
        break;
      case TransportEvent::Kind::kMessage:
        if (coord) {
          link_->Heard();
          CoordinatorMessage(e.type, e.payload);
          // The disk's lease (node_disk.h): half the coordinator's silence
          // before it declares a node lost. Once the coordinator ended the
          // job nobody replaces this node: the drain may finish after it is gone.
          const auto lease = o_.config.cluster.heartbeat_interval * o_.config.cluster.heartbeat_misses / 2;
          if (fenced_)
            disk_->EndLease();
          else if (stop_ordered_)
            disk_->LeaseForever();
          else
            disk_->LeaseUntil(now + lease);
        } else if (!replicator_->Handle(e.peer, e.type, e.payload)) {
          FTRUN_LOG_WARN("agent {} sent an unexpected {}", e.peer, ClusterMsgName(e.type));
        }
        break;
      case TransportEvent::Kind::kBulkDone:
        replicator_->BulkDone(e.token, e.status);
        break;
    }
    if (state_ == State::kDone) return;
  }
}

void Agent::ApplyAssign(const AssignMsg& m) {
  if (local_coord_) {
    // A one-node job's place in its world is its command line's
    // (--world_info, --node_rank): its own coordinator knows its ranks only.
    assigned_ = true;
    return;
  }
  if (state_ == State::kRunning || state_ == State::kStopping) {
    FTRUN_LOG_ERROR("coordinator assigned node {} while ranks run; ignored", m.slot);
    return;
  }
  assigned_ = true;
  o_.node_rank = m.slot;
  o_.first_global_rank = m.first_rank;
  o_.local_ranks = m.local_ranks;
  o_.world_size = m.world_size;
  o_.num_nodes = m.num_slots;
  disk_->Assign(m.slot, m.world_size);
  if (static_cast<int>(o_.slots.size()) != m.local_ranks) {
    o_.slots.clear();
    for (int i = 0; i < m.local_ranks; ++i) o_.slots.push_back(i);
  }
  ranks_->Assign(m.first_rank, m.local_ranks);
  FTRUN_LOG_INFO("this agent is node {}: ranks {}..{} of {}", m.slot, m.first_rank, m.first_rank + m.local_ranks - 1,
                 m.world_size);
  status_dirty_ = true;
}

void Agent::ApplyMembership(const MembershipMsg& m) {
  if (!replicator_) return;  // one node: nobody to copy to
  peers_->Set(m);
  peers_->Connect(m.my_holders);
  replicator_->SetHolders(m.my_holders);
  replicator_->SetRoles(PeerRoles(m));
  status_dirty_ = true;
}

void Agent::CoordinatorTick(Clock::time_point now) {
  if (local_coord_) return local_coord_->Tick(now);
  pulls_->Tick(now);       // a plan that never ends is the coordinator's to decide
  replicator_->Tick(now);  // cancels copies that stalled (cluster.copy_timeout)
  link_->Tick(now);        // heartbeats, silence, reconnecting, giving up
}

void Agent::ClusterRankSaved(int rank, uint64_t version) {
  held_pending_.push_back({rank, version});  // replication waits for the round (kReplicate)
  if (round_) round_->Saved(rank, version);
  retention_->Saved(version, ranks_->Ranks(), round_ ? round_->version() : std::nullopt);  // bounded while it runs
}

// The held reports of one pass of the event loop (saves, copies stored
// here) go in one message.
void Agent::FlushHeld() {
  if (held_pending_.empty()) return;
  Report(HeldMsg{epoch_, std::move(held_pending_)});
  held_pending_.clear();
}

void Agent::RoundFailed(uint64_t version) { Report(RoundFailedMsg{epoch_, version}); }

}  // namespace ftrun
