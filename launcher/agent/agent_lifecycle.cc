// The agent's rank lifecycle: spawn a generation, notice a death or a hang
// (the processes themselves are rank_processes.h's), report it to the
// coordinator and stop this node's ranks; end the job on a signal.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/agent/agent.h"
#include "launcher/agent/rank_env.h"
#include "plugin/common/bytes.h"
#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/common/proc_start.h"
#include "plugin/common/safe_dir.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {

void Agent::SpawnGeneration() {
  auto now = clock_.Now();
  for (RankSlot& s : ranks_->slots()) {
    RankIdentity id{s.local_rank, s.global_rank, generation_, lock_.socket_path()};
    SpawnSpec spec;
    spec.argv = BuildRankCommand(o_, s.local_rank);
    spec.env = BuildRankEnv(o_, id);
    if (!o_.each_rank_log_dir.empty()) spec.log_file = RankLogPath(o_.each_rank_log_dir, s.global_rank);
    UniqueFd stderr_pipe;
    Status st = rank_output_ ? rank_output_->NewPipe(s.global_rank, &stderr_pipe) : Status::Ok();
    spec.stderr_fd = stderr_pipe.get();
    if (st.ok()) st = ranks_->Spawn(s, spec);
    if (!st.ok()) {
      FTRUN_LOG_ERROR("cannot start rank {}: {}", s.global_rank, st.message());
      exit_code_ = 2;
      BeginStop(StopCause::kShutdown, "a rank could not be started");
      return;
    }
  }
  FTRUN_LOG_INFO("generation {}: started {} ranks{}", generation_, ranks_->slots().size(),
                 restore_version_ ? ", restoring version " + std::to_string(*restore_version_) : std::string(""));
  recoveries_->Spawned(generation_, now);
  status_dirty_ = true;
}

void Agent::RankEvent(RankSlot& slot, Clock::time_point RankSlot::*field) {
  if (slot.*field != Clock::time_point{}) return;
  slot.*field = clock_.Now();
  Clock::time_point latest{};
  for (const RankSlot& s : ranks_->slots()) {
    if (s.*field == Clock::time_point{}) return;
    latest = std::max(latest, s.*field);
  }
  using Phase = RecoveryLog::Phase;
  const Phase phase = field == &RankSlot::connected  ? Phase::kConnected
                      : field == &RankSlot::restored ? Phase::kRestored
                                                     : Phase::kFirstStep;
  recoveries_->AllRanks(generation_, phase, latest);
  if (phase == Phase::kFirstStep) status_dirty_ = true;
}

void Agent::Signals() {
  for (int sig : loop_.TakeSignals()) {
    if (sig == SIGCHLD) {
      pid_t pid;
      ExitInfo info;
      while (ReapOne(&pid, &info)) ChildExited(pid, info);
    } else if (state_ != State::kDone && !(state_ == State::kStopping && stop_cause_ == StopCause::kShutdown)) {
      shutdown_signal_ = sig;
      FTRUN_LOG_WARN("received signal {}: stopping the job", shutdown_signal_);
      BeginStop(StopCause::kShutdown, "agent received signal " + std::to_string(shutdown_signal_));
    }
  }
}

void Agent::ChildExited(pid_t pid, const ExitInfo& info) {
  RankSlot* slot = ranks_->Exited(pid);  // (while stopping, the last one begins the drain)
  if (slot == nullptr) return;
  // Its socket may still hold frames; nothing of this generation may count
  // after the rank is gone, unless it finished cleanly.
  if (state_ == State::kRunning && info.signaled == false && info.code == 0) {
    slot->finished = true;
    FTRUN_LOG_INFO("rank {} finished", slot->global_rank);
    bool all = true;
    for (const RankSlot& s : ranks_->slots()) all &= s.finished;
    ranks_->KillFinishedGroup(*slot);
    if (all) {
      FTRUN_LOG_INFO("all {} ranks finished; last committed version {}", ranks_->slots().size(),
                     service_->last_committed() ? std::to_string(*service_->last_committed()) : "none");
      exit_code_ = 0;
      state_ = State::kIdle;  // the job ends when the coordinator says every node is done
      Report(NodeDoneMsg{member_->epoch()});
    }
    return;
  }
  if (state_ == State::kRunning) {
    FTRUN_LOG_ERROR("rank {} (pid {}) {}", slot->global_rank, pid, info.Describe());
    std::string reason = "rank " + std::to_string(slot->global_rank) + " " + info.Describe();
    const bool early = slot->first_step == Clock::time_point{} && EarlyFailureRule::Counts(info.ShellCode());
    if (early) {
      std::string words = LastWords(*slot);
      reason += " before its first save" + (words.empty() ? std::string() : "; its last lines:\n" + words);
    }
    FailRank(reason, info, early);
  }
}

// A rank died or hung: this node's ranks stop at once, and the coordinator
// decides what follows (a restart of every node's ranks from the committed
// version, or the job's end), after this node settled the chunks its ranks
// found corrupted.
void Agent::FailRank(const std::string& reason, const ExitInfo& info, bool early) {
  SettleCorruptChunks();
  Report(RankFailedMsg{member_->epoch(), info.ShellCode(), reason, early});
  BeginStop(StopCause::kFailure, reason);
}

// The chunks this node's ranks (or its replicator) found corrupted are
// repaired or dropped; the coordinator learns which snapshots went with
// them before it plans the restart.
void Agent::SettleCorruptChunks() {
  CorruptChunks::Dropped d = corrupt_->Settle();
  if (d.snapshots.empty()) return;
  status_dirty_ = true;
  Report(DroppedMsg{member_->epoch(), std::move(d.snapshots), std::move(d.why)});
}

// What a rank said last: its stderr pipe's tail, or its own log file's.
std::string Agent::LastWords(const RankSlot& s) {
  constexpr size_t kLines = 10;
  if (rank_output_) return rank_output_->Tail(s.global_rank, kLines);
  return FileTail(RankLogPath(o_.each_rank_log_dir, s.global_rank), kLines);
}

void Agent::BeginStop(StopCause cause, const std::string& reason) {
  stop_cause_ = cause;
  SettleCorruptChunks();
  state_ = State::kStopping;
  if (cause == StopCause::kFailure) recoveries_->Failed(generation_ + 1, reason);
  // Fence the failed generation: nothing it still has in flight may land.
  server_->CloseAll("generation stopped");
  status_dirty_ = true;
  ranks_->Stop([this] { RanksStopped(); });
}

void Agent::RanksStopped() {
  // The saves above the last commit are void, but the coordinator may have
  // committed one of them already (it counted this node's save, and the
  // commit is still on its way here): they go once the coordinator's halt,
  // sent after any such commit, has arrived (Stopped, Halt), or at the next
  // start.
  if (stop_cause_ == StopCause::kShutdown) {
    retention_->Halted();
    if (shutdown_signal_ != 0) exit_code_ = 128 + shutdown_signal_;
    state_ = State::kDone;
    return;
  }
  recoveries_->Stopped();
  Stopped();  // restarts are the coordinator's call
}

void Agent::Tick() {
  loop_.TakeTicks();
  auto now = clock_.Now();
  service_->Tick(now);
  disk_->Tick(now);
  server_->Tick();  // silent connections, a paused listen
  ranks_->Tick();   // a stop past its grace, the drain
  if (state_ == State::kRunning) {
    // A rank blocked in WaitCommitted is waiting, not hanging, as long as
    // some other rank is still working towards the commit.
    auto waiting = [&](const RankSlot& s) {
      const Connection* c = server_->Find(s.conn_id);
      return c != nullptr && service_->Waiting(*c);
    };
    if (RankSlot* s = ranks_->Hung(waiting)) {
      std::string reason = "rank " + std::to_string(s->global_rank) + " hung: no progress for " +
                           std::to_string(o_.config.job.hang_timeout.count()) + " ms (job.hang_timeout)";
      FTRUN_LOG_ERROR("{}", reason);
      FailRank(reason, ExitInfo{true, SIGKILL});
    }
  }
  member_->Tick(now);
  if (prefaulted_ != reported_prefaulted_) status_dirty_ = true;
  if (status_dirty_ && now - last_status_write_ > std::chrono::milliseconds(200)) WriteStatus();
}

}  // namespace ftrun
