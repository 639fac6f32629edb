// CommitRound: this node's part of a commit round. The coordinator names a
// version (kReplicate) once every rank saved it; each of this node's ranks
// that has it is copied to its holders at once, and a rank that has not
// saved it yet (the round may target the newest version of the job's
// fastest rank: ranks that run more than VersionRetention::kKeepVersions
// steps apart share no other) is copied when it does. A rank that skipped
// it, or whose copy was released meanwhile, fails the round: the
// coordinator names another.
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "plugin/store/snapshot_store.h"

namespace ftrun {

class CommitRound {
 public:
  // `copy`: starts copying (rank, version) to its holders. `failed`: the
  // round of `version` cannot complete here.
  CommitRound(const SnapshotStore* store, std::function<void(int rank, uint64_t version)> copy,
              std::function<void(uint64_t version)> failed)
      : store_(store), copy_(std::move(copy)), failed_(std::move(failed)) {}

  // The coordinator's round of `version`, for this node's `ranks`.
  void Begin(uint64_t version, const std::vector<int>& ranks);
  // A rank of this node saved `version`.
  void Saved(int rank, uint64_t version);
  // The generation stopped or started again: no round runs.
  void End();

  // The version the current round copies.
  std::optional<uint64_t> version() const { return version_; }

 private:
  void Fail(uint64_t version);

  const SnapshotStore* const store_;
  const std::function<void(int, uint64_t)> copy_;
  const std::function<void(uint64_t)> failed_;
  std::optional<uint64_t> version_;
  std::set<int> waiting_;  // ranks that have not saved version_ yet: copied when they do
};

}  // namespace ftrun
