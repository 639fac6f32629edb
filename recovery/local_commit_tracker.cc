#include "recovery/commit_tracker.h"

namespace ftrun {

LocalCommitTracker::LocalCommitTracker(std::vector<int> ranks) : ranks_(ranks.begin(), ranks.end()) {}

std::optional<uint64_t> LocalCommitTracker::OnRankHeld(int rank, uint64_t version) {
  if (!ranks_.count(rank) || (committed_ && version <= *committed_)) return std::nullopt;
  auto& held = pending_[version];
  held.insert(rank);
  if (held.size() < ranks_.size()) return std::nullopt;
  committed_ = version;
  // Older pending versions can no longer be the restore point.
  pending_.erase(pending_.begin(), pending_.upper_bound(version));
  return version;
}

}  // namespace ftrun
