// The agent and its coordinator: the orders it obeys (decoded here, carried
// out in agent_epoch.cc, agent_pull.cc, agent_cluster.cc), the reports it
// sends, and for a one-node job the coordinator it hosts itself
// (local_coordinator.h), so that every job commits and recovers through the
// same policy (recovery/coordinator.h).
#include <algorithm>

#include "launcher/agent/agent.h"
#include "launcher/common/disk_scan.h"
#include "launcher/common/disk_worker.h"
#include "plugin/common/log.h"

namespace ftrun {

Status Agent::SetupLocalCoordinator() {
  const Config& c = o_.config;
  Coordinator::Options co;
  co.ranks_per_slot = {o_.local_ranks};
  co.first_rank = o_.first_global_rank;
  co.world_size = o_.world_size;
  co.replicas = 0;  // no other node to copy to
  co.heartbeat_interval = c.cluster.heartbeat_interval;
  co.lost_node_timeout = c.cluster.lost_node_timeout;
  co.copy_timeout = c.cluster.copy_timeout;
  co.max_restarts = c.job.max_restarts;
  co.master_port = o_.master_port;
  if (persist()) {
    // Scanned on the disk worker, as the runner does: the loop goes on.
    co.scan_disk = [this] {
      if (Status s = StartDiskWorker(); !s.ok()) {
        return local_coord_->DiskScanned(s, {}, clock_.Now());
      }
      disk_worker_->Submit([this, dir = disk_->dir(), job = o_.job_id, world = o_.world_size] {
        std::vector<uint64_t> versions;
        Status s = ScanDiskVersions(dir, job, world, &versions);
        return DiskWorker::Completion([this, s, versions] { local_coord_->DiskScanned(s, versions, clock_.Now()); });
      });
    };
  }
  local_coord_ = std::make_unique<LocalCoordinator>(std::move(co), static_cast<PeerId>(o_.agent_id));
  RegisterWithCoordinator();
  return Status::Ok();
}

void Agent::PumpCoordinator() {
  if (!local_coord_) return;
  local_coord_->Pump([this](uint16_t type, const std::string& payload) { CoordinatorMessage(type, payload); },
                     clock_.Now());
}

Status Agent::StartDiskWorker() {
  if (disk_worker_) return Status::Ok();
  auto w = std::make_unique<DiskWorker>();
  FTRUN_RETURN_IF_ERROR(w->Start());
  FTRUN_RETURN_IF_ERROR(loop_.Add(w->event_fd(), kDiskTag));
  disk_worker_ = std::move(w);
  return Status::Ok();
}

void Agent::JoinEpoch(uint64_t epoch) {
  if (epoch > epoch_) FlushHeld();  // (the old epoch's: the coordinator ignores them)
  epoch_ = std::max(epoch_, epoch);
  if (replicator_) replicator_->SetEpoch(epoch_);
}

void Agent::SendToCoordinator(ClusterMsg type, const std::string& payload) {
  // What the store held goes first: the coordinator reads every report in
  // the order things happened here (a save, then the rank's exit).
  if (type != ClusterMsg::kHeld) FlushHeld();
  if (local_coord_)
    local_coord_->Report(type, payload);
  else if (link_ && link_->up())
    transport_->Send(kCoordinatorPeer, static_cast<uint16_t>(type), payload);
}

void Agent::RegisterWithCoordinator() {
  RegisterMsg m;
  // A one-node job's coordinator knows one node: its own ranks.
  m.slot = local_coord_ ? 0 : assigned_ ? o_.node_rank : (o_.spare ? -1 : o_.node_rank);
  // The host part is the rendezvous address the coordinator's start names.
  m.address = local_coord_ ? o_.master_addr + ":0" : transport_->address();
  m.rack = o_.rack;
  m.epoch = epoch_;
  m.committed = service_->last_committed();
  if (m.committed) {
    for (int rank : store_->RanksAt(*m.committed)) m.catalog.push_back({rank, *m.committed});
  }
  Report(m);
}

void Agent::CoordinatorMessage(uint16_t type, const std::string& payload) {
  // Each order decoded into its struct (cluster_messages.h) and then acted
  // on; a malformed one is dropped with a WARN, nothing of it acted on.
  auto on = [&](auto m, auto act) {
    if (Status s = Decode(payload, &m); !s.ok()) {
      FTRUN_LOG_WARN("coordinator sent a bad {}: {}", ClusterMsgName(type), s.message());
    } else {
      act(m);
    }
  };
  switch (static_cast<ClusterMsg>(type)) {
    case ClusterMsg::kCoordHeartbeat:
      return on(CoordHeartbeatMsg{}, [](const CoordHeartbeatMsg&) {});
    case ClusterMsg::kAssign:
      return on(AssignMsg{}, [&](const AssignMsg& m) { ApplyAssign(m); });
    case ClusterMsg::kMembership:
      return on(MembershipMsg{}, [&](const MembershipMsg& m) { ApplyMembership(m); });
    case ClusterMsg::kPull:
      return on(PullMsg{}, [&](const PullMsg& m) { StartPulls(m); });
    case ClusterMsg::kStart:
      return on(StartMsg{}, [&](const StartMsg& m) { Start(m); });
    case ClusterMsg::kHalt:
      return on(HaltMsg{}, [&](const HaltMsg& m) { Halt(m.epoch); });
    case ClusterMsg::kDropAbove:
      return on(DropAboveMsg{}, [&](const DropAboveMsg& m) { disk_->DropFilesAbove(m.version, ranks_->Ranks()); });
    case ClusterMsg::kReplicate:
      // (A one-node job's coordinator has no holders to order copies to.)
      return on(ReplicateMsg{}, [&](const ReplicateMsg& m) {
        if (m.epoch != epoch_ || !round_) return;
        retention_->RoundTargets(m.version);
        round_->Begin(m.version, ranks_->Ranks());
      });
    case ClusterMsg::kCommit:
      return on(CommitMsg{}, [&](const CommitMsg& m) {
        tracker_.Committed(m.version);
        commit_epoch_ = m.epoch;  // the timeline its disk markers record (NodeDisk::Committed)
        service_->OnCommitted(m.version);
        commit_epoch_.reset();
        status_dirty_ = true;
      });
    case ClusterMsg::kStop:
      return on(StopMsg{}, [&](const StopMsg& m) { Ended(m.code, m.message, false); });
    case ClusterMsg::kFenced:
      return on(FencedMsg{}, [&](const FencedMsg& m) { Ended(1, m.message, true); });
    default:
      FTRUN_LOG_WARN("coordinator sent an unexpected {}", ClusterMsgName(type));
  }
}

// kStop (the job ends with `code`) or kFenced (this agent is out of it).
void Agent::Ended(int code, const std::string& msg, bool fenced) {
  if (fenced)
    fenced_ = true;  // never drains: its node is someone else's (NodeDisk::Drain)
  else
    stop_ordered_ = true;
  if (fenced)
    FTRUN_LOG_ERROR("fenced out of the job by the coordinator: {}", msg);
  else if (local_coord_) {
  }  // the coordinator's own log line said it
  else if (code == 0)
    FTRUN_LOG_INFO("the coordinator ends the job: {}", msg);
  else
    FTRUN_LOG_ERROR("the coordinator stops the job: {}", msg);
  exit_code_ = code;
  // A restart that never came is no recovery (the status lists recoveries).
  recoveries_->Abandoned();
  if (state_ == State::kRunning)
    BeginStop(StopCause::kShutdown, msg);
  else if (state_ != State::kStopping)
    state_ = State::kDone;
  else
    stop_cause_ = StopCause::kShutdown;
}

}  // namespace ftrun
