// RecoveryLog: every restart of this node's ranks, timed phase by phase:
// detected (a rank failed, or the coordinator halted the ranks), stopped
// (the failed generation's ranks are gone, or parked warm), spawned (or
// resumed), and the moments the
// last rank connected, restored and completed its first step. The agent's
// status file lists them (with raw CLOCK_MONOTONIC stamps that compare with
// other processes' clocks), and the benchmarks read them
// (docs/benchmarks.md).
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plugin/common/clock.h"

namespace ftrun {

class RecoveryLog {
 public:
  using Time = ftrun::Clock::Time;
  struct Record {
    int restart = 0;  // the generation it starts
    std::string reason;
    std::optional<uint64_t> version;  // restored; none: a fresh start
    Time detected, stopped, spawned;
    std::optional<Time> connected, restored, first_step;  // all ranks
    // How its ranks were started: survivors resumed in their own processes
    // and warm standbys (warm_ranks.h), or new processes (cold).
    int survivors = 0, standbys = 0, cold = 0;
    // "warm" (no new process), "cold" (only new ones), "mixed", or "none"
    // (no ranks here).
    const char* kind() const;
  };
  struct Started {
    int survivors = 0, standbys = 0, cold = 0;
  };
  enum class Phase { kConnected, kRestored, kFirstStep };

  explicit RecoveryLog(const ftrun::Clock& clock) : clock_(clock) {}

  // This node's ranks of generation `restart` - 1 are stopping for `reason`.
  void Failed(int restart, const std::string& reason);
  // They are gone.
  void Stopped();
  // The coordinator starts generation `restart` from `version`. A node
  // that stopped nothing (a replacement, a node back from a loss) with
  // ranks to start gets a record too, for `takeover` ("" when it has no
  // ranks): its ranks are part of the recovery.
  void Starting(int restart, std::optional<uint64_t> version, const std::string& takeover, int max_restarts);
  // Its ranks were started, beginning at `at`, as `how` says.
  void Spawned(int generation, Time at, Started how);
  // The job ended before a restart that was pending: no recovery.
  void Abandoned();
  // Every rank of `generation` reached `phase`, the last one at `latest`.
  void AllRanks(int generation, Phase phase, Time latest);

  const std::vector<Record>& records() const { return records_; }
  // The status file's "recoveries" (see README).
  nlohmann::json ToJson() const;

 private:
  bool pending() const { return !records_.empty() && records_.back().spawned == Time{}; }

  const ftrun::Clock& clock_;
  std::vector<Record> records_;
};

}  // namespace ftrun
