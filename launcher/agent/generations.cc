// Generations: spawning a generation, a rank's death or hang, stopping the
// ranks, a signal to the agent. (The coordinator's orders are in
// generations_orders.cc.)
#include "launcher/agent/generations.h"

#include <signal.h>

#include <algorithm>

#include "plugin/common/log.h"
#include "recovery/early_failure.h"

namespace ftrun {

Generations::Generations(Parts parts, Hooks hooks, Options o, const Clock& clock)
    : p_(parts), h_(std::move(hooks)), o_(o), clock_(clock) {}

const char* Generations::state_name() const {
  const char* names[] = {"running", "stopping", "idle", "done"};
  return names[static_cast<int>(state_)];
}

void Generations::Spawn() {
  auto now = clock_.Now();
  WarmRanks::Resumed counts;
  if (p_.warm) p_.warm->Begin(generation_);
  for (Slot& s : p_.ranks->slots()) {
    // (The job's first start is cold: standbys are for the dead ranks of a restart.)
    if (p_.warm && generation_ > 0 && p_.warm->Resume(s, generation_, restore_version_)) continue;
    ++counts.cold;
    if (Status st = h_.spawn(s, generation_); !st.ok()) {
      FTRUN_LOG_ERROR("cannot start rank {}: {}", s.global_rank, st.message());
      exit_code_ = 2;
      BeginStop(StopCause::kShutdown, "a rank could not be started");
      return;
    }
  }
  if (p_.warm) {
    counts.survivors = p_.warm->resumed().survivors;
    counts.standbys = p_.warm->resumed().standbys;
  }
  FTRUN_LOG_INFO("generation {}: {} ranks ({} resumed in their processes, {} from warm standbys, {} started){}",
                 generation_, p_.ranks->slots().size(), counts.survivors, counts.standbys, counts.cold,
                 restore_version_ ? ", restoring version " + std::to_string(*restore_version_) : std::string(""));
  p_.recoveries->Spawned(generation_, now, {counts.survivors, counts.standbys, counts.cold});
  h_.changed();
}

void Generations::RankEvent(Slot& slot, Clock::Time Slot::*field) {
  if (slot.*field != Clock::Time{}) return;
  slot.*field = clock_.Now();
  Clock::Time latest{};
  for (const Slot& s : p_.ranks->slots()) {
    if (s.*field == Clock::Time{}) return;
    latest = std::max(latest, s.*field);
  }
  using Phase = RecoveryLog::Phase;
  const Phase phase = field == &Slot::connected  ? Phase::kConnected
                      : field == &Slot::restored ? Phase::kRestored
                                                 : Phase::kFirstStep;
  p_.recoveries->AllRanks(generation_, phase, latest);
  if (phase == Phase::kFirstStep) h_.changed();
}

void Generations::Signal(int sig) {
  if (state_ == State::kDone || (state_ == State::kStopping && stop_cause_ == StopCause::kShutdown)) return;
  shutdown_signal_ = sig;
  FTRUN_LOG_WARN("received signal {}: stopping the job", sig);
  BeginStop(StopCause::kShutdown, "agent received signal " + std::to_string(sig));
}

void Generations::ChildExited(pid_t pid, const ExitInfo& info) {
  if (p_.warm && p_.warm->StandbyExited(pid)) return;
  Slot* slot = p_.ranks->Exited(pid);  // (while stopping, the last one begins the drain)
  if (slot == nullptr) return;
  if (p_.warm) p_.warm->SlotExited();  // a survivor that died leaving its generation
  // Its socket may still hold frames; nothing of this generation may count
  // after the rank is gone, unless it finished cleanly.
  if (state_ == State::kRunning && info.signaled == false && info.code == 0) {
    slot->finished = true;
    FTRUN_LOG_INFO("rank {} finished", slot->global_rank);
    bool all = true;
    for (const Slot& s : p_.ranks->slots()) all &= s.finished;
    p_.ranks->KillFinishedGroup(*slot);
    if (all) {
      const auto committed = p_.tracker->last_committed();
      FTRUN_LOG_INFO("all {} ranks finished; last committed version {}", p_.ranks->slots().size(),
                     committed ? std::to_string(*committed) : "none");
      exit_code_ = 0;
      state_ = State::kIdle;  // the job ends when the coordinator says every node is done
      Report(NodeDoneMsg{p_.member->epoch()});
    }
    return;
  }
  if (state_ == State::kRunning) {
    FTRUN_LOG_ERROR("rank {} (pid {}) {}", slot->global_rank, pid, info.Describe());
    std::string reason = "rank " + std::to_string(slot->global_rank) + " " + info.Describe();
    const bool early = slot->first_step == Clock::Time{} && EarlyFailureRule::Counts(info.ShellCode());
    if (early) {
      std::string words = h_.last_words(*slot);
      reason += " before its first save" + (words.empty() ? std::string() : "; its last lines:\n" + words);
    }
    FailRank(reason, info, early);
  }
}

void Generations::RankRaised(Slot& slot, const std::string& reason) {
  if (state_ != State::kRunning) return;
  std::string why = "rank " + std::to_string(slot.global_rank) + " raised in its training function: " + reason;
  FTRUN_LOG_ERROR("{}", why);
  const bool early = slot.first_step == Clock::Time{} && EarlyFailureRule::Counts(1);
  FailRank(why, ExitInfo{false, 1}, early);
}

void Generations::CheckHung() {
  if (state_ != State::kRunning) return;
  // A rank blocked in WaitCommitted is waiting, not hanging, as long as
  // some other rank is still working towards the commit.
  if (Slot* s = p_.ranks->Hung(h_.waiting)) {
    std::string reason = "rank " + std::to_string(s->global_rank) + " hung: no progress for " +
                         std::to_string(o_.hang_timeout.count()) + " ms (job.hang_timeout)";
    FTRUN_LOG_ERROR("{}", reason);
    FailRank(reason, ExitInfo{true, SIGKILL});
  }
}

// A rank died or hung: this node's ranks stop at once, and the coordinator
// decides what follows (a restart of every node's ranks from the committed
// version, or the job's end), after this node settled the chunks its ranks
// found corrupted.
void Generations::FailRank(const std::string& reason, const ExitInfo& info, bool early) {
  SettleCorruptChunks();
  Report(RankFailedMsg{p_.member->epoch(), info.ShellCode(), reason, early});
  BeginStop(StopCause::kFailure, reason);
}

void Generations::SettleCorruptChunks() {
  CorruptChunks::Dropped d = p_.corrupt->Settle();
  if (d.snapshots.empty()) return;
  h_.changed();
  Report(DroppedMsg{p_.member->epoch(), std::move(d.snapshots), std::move(d.why)});
}

void Generations::BeginStop(StopCause cause, const std::string& reason) {
  stop_cause_ = cause;
  SettleCorruptChunks();
  state_ = State::kStopping;
  if (cause == StopCause::kFailure) p_.recoveries->Failed(generation_ + 1, reason);
  // Fence the failed generation: nothing it still has in flight may land.
  p_.server->CloseAll("generation stopped");
  h_.changed();
  if (p_.warm == nullptr) return StopRanks();
  if (cause == StopCause::kShutdown) {
    p_.warm->Release();
    return StopRanks();
  }
  // The survivors leave the generation first (or are killed at
  // restart.abort_timeout); then the rest go.
  p_.warm->Abort(generation_, [this] { StopRanks(); });
}

void Generations::StopRanks() {
  p_.ranks->Stop([this] { RanksStopped(); });
}

bool Generations::AnyKept() const {
  for (const Slot& s : p_.ranks->slots()) {
    if (s.kept()) return true;
  }
  return false;
}

void Generations::RanksStopped() {
  // The saves above the last commit are void, but the coordinator may have
  // committed one of them already (it counted this node's save, and the
  // commit is still on its way here): they go once the coordinator's halt,
  // sent after any such commit, has arrived (Stopped, Halt), or at the next
  // start.
  if (stop_cause_ == StopCause::kShutdown && AnyKept()) {
    return BeginStop(StopCause::kShutdown, "the job ends");  // the survivors kept when it was a failure's stop
  }
  if (stop_cause_ == StopCause::kShutdown) {
    p_.retention->Halted();
    if (shutdown_signal_ != 0) exit_code_ = 128 + shutdown_signal_;
    state_ = State::kDone;
    return;
  }
  p_.recoveries->Stopped();
  Stopped();  // restarts are the coordinator's call
}

}  // namespace ftrun
