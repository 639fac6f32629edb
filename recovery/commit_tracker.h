// CommitTracker: an agent's view of the committed version. The agent never
// decides a commit: it reports what its ranks saved (and what it holds for
// others) to the job's coordinator (recovery/coordinator.h: in the runner,
// or for a one-node job in the agent itself), and the coordinator's
// kCommit, a start's or a pull's restore point set the version here.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <optional>

namespace ftrun {

class CommitTracker {
 public:
  std::optional<uint64_t> last_committed() const { return committed_; }
  // The coordinator committed `version` (never moves backwards).
  void Committed(uint64_t version) {
    if (!committed_ || version > *committed_) committed_ = version;
  }
  // The job went back to an older version (on disk: more nodes were lost
  // than the replicas cover, or a copy was corrupted with no good one left
  // in RAM): the newer commits are void.
  void Rewind(uint64_t version) { committed_ = version; }

 private:
  std::optional<uint64_t> committed_;
};

}  // namespace ftrun
