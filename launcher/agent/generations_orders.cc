// Generations: the coordinator's orders. It halts the ranks, starts them
// from a version, ends the job, or is lost (the ranks stop until it is
// back).
#include "launcher/agent/generations.h"
#include "plugin/common/log.h"

namespace ftrun {

void Generations::Halt(uint64_t epoch) {
  pending_start_.reset();
  if (state_ == State::kRunning) {
    reply_halted_ = true;
    BeginStop(StopCause::kFailure, "halted by the coordinator (epoch " + std::to_string(epoch) + ")");
  } else if (state_ == State::kStopping) {
    reply_halted_ = true;
  } else if (state_ == State::kIdle) {
    p_.retention->Halted();
    Report(HaltedMsg{p_.member->epoch()});
  }
}

void Generations::Stopped() {
  state_ = State::kIdle;
  h_.changed();
  if (reply_halted_) {
    // The halt came after every commit the coordinator made before it: what
    // is above the last of them is void now (never before: see RanksStopped).
    reply_halted_ = false;
    p_.retention->Halted();
    Report(HaltedMsg{p_.member->epoch()});
  }
  if (pending_start_) {
    StartMsg m = *pending_start_;
    pending_start_.reset();
    Start(m);
  }
}

void Generations::Start(const StartMsg& m) {
  if (state_ == State::kRunning || state_ == State::kStopping) {
    pending_start_ = m;  // the coordinator restarted: stop first
    if (state_ == State::kRunning) BeginStop(StopCause::kFailure, "restart ordered by the coordinator");
    return;
  }
  if (state_ != State::kIdle) return;
  // Above the version the job starts from: a stopped generation's saves and
  // copies, or a timeline the job went back from. Never restored, never
  // acknowledged as a copy of the new timeline's.
  p_.retention->StartsFrom(m.version);
  // Every rank of this node must restore from this node's store: a rank
  // started without its snapshot fails, and the restart that follows would
  // fail the same way, forever. The coordinator learns what is missing and
  // has it pulled from the holders (or goes back to the disk, or stops).
  std::vector<RankVersion> missing;
  for (const Slot& slot : p_.ranks->slots()) {
    if (m.version && !p_.store->Find(slot.global_rank, *m.version)) missing.push_back({slot.global_rank, *m.version});
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
  p_.corrupt->GiveUpDropped([this](int rank) { return p_.ranks->ByRank(rank) != nullptr; }, m.version);
  generation_ = static_cast<int>(m.epoch);
  restore_version_ = m.version;
  h_.starting(m);
  p_.recoveries->Starting(generation_, m.version,
                          p_.ranks->slots().empty() ? "" : "taking over node " + std::to_string(h_.node_rank()),
                          o_.max_restarts);
  state_ = State::kRunning;
  if (!p_.ranks->slots().empty()) Spawn();
}

void Generations::End(int code, const std::string& why) {
  exit_code_ = code;
  // A restart that never came is no recovery (the status lists recoveries).
  p_.recoveries->Abandoned();
  Finish(why);
}

// The job ends for this node: ranks running or kept warm are stopped first.
void Generations::Finish(const std::string& why) {
  if (state_ == State::kRunning || (state_ == State::kIdle && AnyKept())) return BeginStop(StopCause::kShutdown, why);
  if (p_.warm) p_.warm->Release();  // standbys; survivors still leaving their generation
  if (state_ == State::kStopping)
    stop_cause_ = StopCause::kShutdown;
  else
    state_ = State::kDone;
}

void Generations::Lost(const std::string& why) {
  reply_halted_ = false;
  pending_start_.reset();
  if (state_ == State::kRunning) BeginStop(StopCause::kFailure, "lost the coordinator: " + why);
}

void Generations::GaveUp() {
  exit_code_ = 1;
  if (state_ == State::kStopping) {  // its end is the stop's
    if (p_.warm) p_.warm->Release();
    return;
  }
  Finish("no coordinator");
}

}  // namespace ftrun
