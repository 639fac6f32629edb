// The agent's side of a cluster epoch: the coordinator halts the ranks, starts them from a version, or is
// lost (the ranks are fenced until it is back).
#include <algorithm>

#include "launcher/agent/agent.h"
#include "plugin/common/log.h"

namespace ftrun {

// (The member has joined the epoch and ended its commit round.)
void Agent::Halt(uint64_t epoch) {
  restorer_->Cancel();  // a restore from disk in flight is stale now
  pending_start_.reset();
  if (state_ == State::kRunning) {
    reply_halted_ = true;
    BeginStop(StopCause::kFailure, "halted by the coordinator (epoch " + std::to_string(epoch) + ")");
  } else if (state_ == State::kStopping) {
    reply_halted_ = true;
  } else if (state_ == State::kIdle) {
    retention_->Halted();
    Report(HaltedMsg{member_->epoch()});
  }
}

void Agent::Stopped() {
  state_ = State::kIdle;
  status_dirty_ = true;
  if (reply_halted_) {
    // The halt came after every commit the coordinator made before it: what
    // is above the last of them is void now (never before: see RanksStopped).
    reply_halted_ = false;
    retention_->Halted();
    Report(HaltedMsg{member_->epoch()});
  }
  if (pending_start_) {
    StartMsg m = *pending_start_;
    pending_start_.reset();
    Start(m);
  }
}

void Agent::Start(const StartMsg& m) {
  if (state_ == State::kRunning || state_ == State::kStopping) {
    pending_start_ = m;  // the coordinator restarted: stop first
    if (state_ == State::kRunning) BeginStop(StopCause::kFailure, "restart ordered by the coordinator");
    return;
  }
  if (state_ != State::kIdle) return;
  member_->JoinEpoch(m.epoch);
  fenced_ = false;  // re-admitted
  member_->EndRound();
  // Above the version the job starts from: a stopped generation's saves and
  // copies, or a timeline the job went back from. Never restored, never
  // acknowledged as a copy of the new timeline's.
  retention_->StartsFrom(m.version);
  // Every rank of this node must restore from this node's store: a rank
  // started without its snapshot fails, and the restart that follows would
  // fail the same way, forever. The coordinator learns what is missing and
  // has it pulled from the holders (or goes back to the disk, or stops).
  std::vector<RankVersion> missing;
  for (const RankSlot& slot : ranks_->slots()) {
    if (m.version && !store_->Find(slot.global_rank, *m.version)) missing.push_back({slot.global_rank, *m.version});
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& [rank, v] : missing) names += (names.empty() ? "" : ", ") + std::to_string(rank);
    FTRUN_LOG_ERROR(
        "told to start from version {}, but this node's store holds no snapshot of rank(s) {} at it: "
        "not starting them; asking the coordinator to have them pulled",
        *m.version, names);
    return Report(MissingMsg{m.epoch, missing});
  }
  corrupt_->GiveUpDropped([this](int rank) { return ranks_->ByRank(rank) != nullptr; }, m.version);
  generation_ = static_cast<int>(m.epoch);
  restore_version_ = m.version;
  if (m.version) Committed(*m.version);
  o_.master_addr = m.master_addr;
  o_.master_port = m.master_port;
  recoveries_->Starting(generation_, m.version,
                        ranks_->slots().empty() ? "" : "taking over node " + std::to_string(o_.node_rank),
                        o_.config.job.max_restarts);
  state_ = State::kRunning;
  if (!ranks_->slots().empty()) SpawnGeneration();
}

// A restore is planned (the member pulls from the holders): this node is
// re-admitted, and a restore from disk in flight is stale. A plan from disk
// is this agent's to carry out.
void Agent::Readmitted(const PullMsg& m) {
  fenced_ = false;
  restorer_->Cancel();
  if (m.from_disk) PullFromDisk(m);
}

// The link lost the coordinator (a transport error, or silence).
void Agent::Lost(const std::string& why) {
  // Until re-admitted (a pull or a start), another agent may take this node
  // and go back below what this one committed: no drain meanwhile. (After
  // the job's end was ordered the runner may simply have gone.)
  if (!stop_ordered_) {
    fenced_ = true;
    disk_->EndLease();
  }
  FTRUN_LOG_ERROR("lost the coordinator ({}): fencing this node's ranks until it is back", why);
  reply_halted_ = false;
  pending_start_.reset();
  if (state_ == State::kRunning) {
    BeginStop(StopCause::kFailure, "lost the coordinator: " + why);
  }
}

}  // namespace ftrun
