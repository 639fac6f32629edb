// Generations: this node's ranks from one start to the next. The
// coordinator starts a generation from a committed version (or fresh) and
// this spawns its ranks; a rank's death or hang fails the generation (the
// coordinator is told, the node's ranks stop); a halt or a newer start
// stops it; a lost coordinator or the job's end stops it too, and a signal
// to the agent ends the job. Every stop fences the generation's connections
// first and settles the chunks its ranks found corrupted. A failure's stop
// keeps the survivors that run under @ftrun.resilient (warm_ranks.h): they
// leave the generation in their own processes, and the next start resumes
// them and gives the dead ranks' places to warm standbys. What the
// coordinator hears from here: kRankFailed, kDropped, kHalted, kMissing,
// kNodeDone.
//
// Not thread-safe: driven by the agent's event loop, on a Clock.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

#include "launcher/agent/cluster_member.h"
#include "launcher/agent/corrupt_chunks.h"
#include "launcher/agent/rank_processes.h"
#include "launcher/agent/rank_server.h"
#include "launcher/agent/recovery_log.h"
#include "launcher/agent/version_retention.h"
#include "launcher/agent/warm_ranks.h"
#include "launcher/common/supervisor.h"
#include "plugin/store/snapshot_store.h"
#include "recovery/commit_tracker.h"

namespace ftrun {

class Generations {
 public:
  // kIdle: no ranks running, waiting for the coordinator.
  enum class State { kRunning, kStopping, kIdle, kDone };
  using Slot = RankProcesses::Slot;

  // The neighbours, each outliving this.
  struct Parts {
    RankProcesses* ranks = nullptr;
    RankServer* server = nullptr;  // its connections are fenced at each stop
    RecoveryLog* recoveries = nullptr;
    VersionRetention* retention = nullptr;
    CorruptChunks* corrupt = nullptr;
    const SnapshotStore* store = nullptr;
    const CommitTracker* tracker = nullptr;
    ClusterMember* member = nullptr;  // the coordinator's
    WarmRanks* warm = nullptr;        // survivors and standbys (none: every restart is cold)
  };
  // What the agent does for it.
  struct Hooks {
    std::function<Status(Slot& slot, int generation)> spawn;  // one rank's process
    std::function<std::string(const Slot& slot)> last_words;  // the tail of its output
    std::function<bool(const Slot& slot)> waiting;            // blocked in a commit wait, not hung
    std::function<void(const StartMsg& m)> starting;          // its version is committed; its rendezvous
    std::function<int()> node_rank;
    std::function<void()> changed;  // something the status shows
  };
  struct Options {
    int max_restarts = 0;
    std::chrono::milliseconds hang_timeout{0};
  };

  Generations(Parts parts, Hooks hooks, Options o, const Clock& clock);

  // The coordinator's orders (the member has joined a halt's or a start's
  // epoch and ended its commit round when it took the order: once, also for
  // a start that waits here for the ranks to stop).
  void Start(const StartMsg& m);
  void Halt(uint64_t epoch);
  // kStop or kFenced: the job ends for this node with `code`.
  void End(int code, const std::string& why);
  void Lost(const std::string& why);  // the coordinator, until it is back
  void GaveUp();                      // the coordinator, for good

  // The node's events.
  void ChildExited(pid_t pid, const ExitInfo& info);
  void Signal(int sig);  // SIGTERM, SIGINT, SIGHUP to the agent
  // A rank under @ftrun.resilient raised: the generation fails, the rank's
  // process stays (warm_ranks.h).
  void RankRaised(Slot& slot, const std::string& reason);
  void CheckHung();  // on each tick
  // A rank connected, restored or saved for the first time this generation.
  void RankEvent(Slot& slot, Clock::Time Slot::*field);
  // The chunks this node's ranks (or its replicator) found corrupted are
  // repaired or dropped; the coordinator learns which snapshots went.
  void SettleCorruptChunks();
  // The agent cannot go on (its loop failed): the job ends with `code`.
  void Abort(int code) {
    exit_code_ = code;
    state_ = State::kDone;
  }

  State state() const { return state_; }
  bool running() const { return state_ == State::kRunning; }
  bool done() const { return state_ == State::kDone; }
  const char* state_name() const;
  int generation() const { return generation_; }
  const std::optional<uint64_t>& restore_version() const { return restore_version_; }
  int exit_code() const { return exit_code_; }

 private:
  enum class StopCause { kFailure, kShutdown };
  void Spawn();
  // `early`: the rank died before its first save of this generation (see
  // EarlyFailureRule, which the coordinator applies).
  void FailRank(const std::string& reason, const ExitInfo& info, bool early = false);
  void BeginStop(StopCause cause, const std::string& reason);
  void StopRanks();      // those not kept warm
  bool AnyKept() const;  // survivors parked for the next start
  void Finish(const std::string& why);
  void RanksStopped();  // every rank process and group is gone
  void Stopped();       // halted, or started again
  template <class M>
  void Report(const M& m) {
    p_.member->Report(m);
  }

  const Parts p_;
  const Hooks h_;
  const Options o_;
  const Clock& clock_;
  State state_ = State::kIdle;
  StopCause stop_cause_ = StopCause::kFailure;
  int generation_ = 0;
  std::optional<uint64_t> restore_version_;
  int exit_code_ = 0;
  int shutdown_signal_ = 0;
  bool reply_halted_ = false;
  std::optional<StartMsg> pending_start_;
};

}  // namespace ftrun
