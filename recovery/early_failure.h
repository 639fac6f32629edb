// EarlyFailureRule: a failure that restarting cannot cure. A rank that dies
// before its first save of a generation with the same exit code as the early
// death that ended the generation just before (an argparse error, an
// ImportError, a missing file) will die the same way in every later one: the
// job stops after the second such generation, with the rank's last words,
// instead of spending all of job.max_restarts on it.
//
// Deaths by SIGKILL or SIGTERM never count: they come from an operator, the
// OOM killer or a fault injector, not from the program.
//
// The recovery policy owns one (the coordinator for a cluster, the agent for
// a one-node job). Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>

namespace ftrun {

class EarlyFailureRule {
 public:
  // Whether a death with this shell exit code (128+signal for a signal) can
  // be the program's own early failure.
  static bool Counts(int shell_code) { return shell_code != 0 && shell_code != 128 + 9 && shell_code != 128 + 15; }

  // Records the failure that ended `generation`: `early` when the failing
  // rank had not saved in it (and Counts its code). True when this is the
  // second identical early failure in consecutive generations.
  bool Record(uint64_t generation, bool early, int shell_code) {
    bool repeat = early && last_ && last_->generation + 1 == generation && last_->code == shell_code;
    if (early)
      last_ = Last{generation, shell_code};
    else
      last_.reset();
    return repeat;
  }

 private:
  struct Last {
    uint64_t generation;
    int code;
  };
  std::optional<Last> last_;
};

}  // namespace ftrun
