#include "launcher/agent/rank_processes.h"

#include <signal.h>

#include <iterator>

#include "plugin/common/log.h"

namespace ftrun {

void RankProcesses::Assign(int first_rank, int count) {
  slots_.clear();
  for (int i = 0; i < count; ++i) {
    Slot s;
    s.local_rank = i;
    s.global_rank = first_rank + i;
    slots_.push_back(s);
  }
}

RankProcesses::Slot* RankProcesses::ByRank(int global_rank) {
  if (slots_.empty()) return nullptr;
  int i = global_rank - slots_.front().global_rank;
  if (i < 0 || i >= static_cast<int>(slots_.size())) return nullptr;
  return &slots_[static_cast<size_t>(i)];
}

std::vector<int> RankProcesses::Ranks() const {
  std::vector<int> r;
  for (const Slot& s : slots_) r.push_back(s.global_rank);
  return r;
}

Status RankProcesses::Spawn(Slot& slot, const SpawnSpec& spec) {
  Reuse(slot, 0, 0);
  slot.warm = Slot::Warm::kCold;
  slot.control_id = 0;
  slot.sockets_settled.clear();
  Status s = SpawnProcess(spec, &slot.pid);
  if (!s.ok()) {
    slot.pid = 0;
    return s;
  }
  slot.pgid = slot.pid;
  return s;
}

void RankProcesses::Reuse(Slot& slot, pid_t pid, pid_t pgid) {
  slot.pid = pid;
  slot.pgid = pgid;
  slot.finished = false;
  slot.conn_id = 0;
  slot.last_progress = clock_.Now();
  slot.connected = slot.restored = slot.first_step = Time{};
}

RankProcesses::Slot* RankProcesses::Exited(pid_t pid) {
  Slot* slot = nullptr;
  for (Slot& s : slots_) {
    if (s.pid == pid) slot = &s;
  }
  if (slot == nullptr) {  // an orphaned grandchild, reaped as subreaper
    if (draining_) ContinueDrain();
    return nullptr;
  }
  slot->pid = 0;
  if (stopping_ && !draining_ && !AnyToStopAlive()) BeginDrain();
  return slot;
}

bool RankProcesses::AnyAlive() const {
  for (const Slot& s : slots_) {
    if (s.pid != 0) return true;
  }
  return false;
}

bool RankProcesses::AnyToStopAlive() const {
  for (const Slot& s : slots_) {
    if (s.pid != 0 && !s.kept()) return true;
  }
  return false;
}

void RankProcesses::KillFinishedGroup(Slot& slot) {
  // Once empty, the group id may be reused by anyone: forgotten.
  SignalGroup(slot.pgid, SIGKILL);
  slot.pgid = 0;
}

void RankProcesses::Stop(std::function<void()> stopped) {
  stopped_ = std::move(stopped);
  if (stopping_) return;
  stopping_ = true;
  killed_hard_ = false;
  stop_deadline_ = clock_.Now() + o_.stop_grace;
  for (Slot& s : slots_) {
    if (!s.kept()) SignalGroup(s.pgid, SIGTERM);  // the group even when its leader is gone
  }
  if (!AnyToStopAlive()) BeginDrain();
}

void RankProcesses::BeginDrain() {
  // Every rank process is gone; what is left of their groups (their
  // children, reparented to the agent as subreaper) is killed.
  for (Slot& s : slots_) {
    if (!s.kept()) SignalGroup(s.pgid, SIGKILL);
  }
  draining_ = true;
  drain_deadline_ = clock_.Now() + o_.drain_bound;
  ContinueDrain();
}

void RankProcesses::ContinueDrain() {
  bool left = false;
  for (Slot& s : slots_) {
    if (s.kept()) continue;
    if (s.pgid != 0 && ::kill(-s.pgid, 0) == 0)
      left = true;
    else
      s.pgid = 0;
  }
  if (left && clock_.Now() < drain_deadline_) return;  // an Exited or a Tick
  if (left) {
    FTRUN_LOG_ERROR(
        "processes of stopped ranks survive SIGKILL after {} s (uninterruptible I/O?); going on "
        "and killing them as they can be",
        std::chrono::duration_cast<std::chrono::seconds>(o_.drain_bound).count());
    for (Slot& s : slots_) {
      if (s.kept()) continue;
      if (s.pgid != 0) stragglers_.push_back(s.pgid);
      s.pgid = 0;
    }
  }
  draining_ = false;
  stopping_ = false;
  auto stopped = std::move(stopped_);
  stopped_ = nullptr;
  if (stopped) stopped();
}

RankProcesses::Slot* RankProcesses::Hung(const std::function<bool(const Slot&)>& waiting) {
  if (stopping_ || o_.hang_timeout.count() <= 0) return nullptr;
  const Time now = clock_.Now();
  auto waits = [&](const Slot& s) { return s.conn_id != 0 && waiting(s); };
  bool working = false;
  for (const Slot& s : slots_) working |= s.pid != 0 && !s.finished && !waits(s);
  for (Slot& s : slots_) {
    if (working && waits(s)) s.last_progress = now;
  }
  for (Slot& s : slots_) {
    if (s.pid != 0 && !s.finished && now - s.last_progress > o_.hang_timeout) return &s;
  }
  return nullptr;
}

void RankProcesses::Tick() {
  for (auto it = stragglers_.begin(); it != stragglers_.end();) {
    SignalGroup(*it, SIGKILL);
    it = ::kill(-*it, 0) == 0 ? std::next(it) : stragglers_.erase(it);
  }
  if (draining_) return ContinueDrain();
  if (stopping_ && !killed_hard_ && clock_.Now() >= stop_deadline_) {
    killed_hard_ = true;
    for (Slot& s : slots_) {
      if (s.kept()) continue;
      if (s.pid != 0) FTRUN_LOG_WARN("rank {} did not stop within job.stop_grace: SIGKILL", s.global_rank);
      SignalGroup(s.pgid, SIGKILL);
    }
  }
}

}  // namespace ftrun
