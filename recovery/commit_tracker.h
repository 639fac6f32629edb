// CommitTracker: decides when a version is committed. A version is
// committed once every rank it tracks reports that rank's manifest for that
// version as held at the required redundancy. Only committed versions are
// ever restored.
//
// LocalCommitTracker is the one-node rule (every local rank's manifest is
// complete in the node's store). The cluster-wide coordinator implements
// the same interface with replication acknowledgements.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace ftrun {

class CommitTracker {
 public:
  virtual ~CommitTracker() = default;
  // `rank`'s manifest for `version` is held. Returns the version this
  // committed, if any (the newest one that became complete).
  virtual std::optional<uint64_t> OnRankHeld(int rank, uint64_t version) = 0;
  virtual std::optional<uint64_t> last_committed() const = 0;
  // Forgets versions not committed yet (their generation failed).
  virtual void DiscardPending() = 0;
};

class LocalCommitTracker : public CommitTracker {
 public:
  explicit LocalCommitTracker(std::vector<int> ranks);

  std::optional<uint64_t> OnRankHeld(int rank, uint64_t version) override;
  std::optional<uint64_t> last_committed() const override { return committed_; }
  void DiscardPending() override { pending_.clear(); }
  // The node goes back to an older version (a corrupted chunk took the
  // committed one, and that older one is whole in RAM or on disk).
  void Rewind(uint64_t version) {
    committed_ = version;
    pending_.clear();
  }

 private:
  std::set<int> ranks_;
  std::optional<uint64_t> committed_;
  std::map<uint64_t, std::set<int>> pending_;  // version -> ranks held
};

}  // namespace ftrun
