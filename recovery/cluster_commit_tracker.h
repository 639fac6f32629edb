// ClusterCommitTracker: the agent's view of commits in a multi-node job.
// The agent does not decide: it reports held manifests to the coordinator,
// and the coordinator's broadcast sets the committed version (Committed).
#pragma once

#include <optional>

#include "recovery/commit_tracker.h"

namespace ftrun {

class ClusterCommitTracker : public CommitTracker {
 public:
  std::optional<uint64_t> OnRankHeld(int, uint64_t) override { return std::nullopt; }
  std::optional<uint64_t> last_committed() const override { return committed_; }
  void DiscardPending() override {}
  // The coordinator committed `version` (never moves backwards).
  void Committed(uint64_t version) {
    if (!committed_ || version > *committed_) committed_ = version;
  }
  // The coordinator restores an older version from disk (more nodes were
  // lost than the replicas cover): the newer commits are void.
  void Rewind(uint64_t version) { committed_ = version; }

 private:
  std::optional<uint64_t> committed_;
};

}  // namespace ftrun
