#include "launcher/agent/version_retention.h"

#include <algorithm>

namespace ftrun {

void VersionRetention::Committed(uint64_t version) { store_->ReleaseBelow(version); }

void VersionRetention::Halted() { store_->DiscardAbove(tracker_->last_committed()); }

void VersionRetention::StartsFrom(std::optional<uint64_t> version) { store_->DiscardAbove(version); }

void VersionRetention::RestoreFailed(uint64_t version) {
  store_->DiscardAbove(version > 0 ? std::optional<uint64_t>(version - 1) : std::nullopt);
}

void VersionRetention::RoundTargets(uint64_t version, const std::vector<int>& node_ranks) {
  // What lies between the commit and the round's version can never be
  // committed. But the round may target the fastest rank's newest save
  // (the coordinator's "ahead" rounds): a rank of this node that has not
  // saved that version yet keeps its last save, which its next save
  // references (freeing it made that save fail with CHUNK_MISSING).
  uint64_t high = version;
  for (int rank : node_ranks) {
    if (store_->Find(rank, version) == nullptr) high = std::min(high, store_->LastSaved(rank).value_or(0));
  }
  store_->ReleaseBetween(tracker_->last_committed(), high);
}

void VersionRetention::Saved(uint64_t version, const std::vector<int>& node_ranks, std::optional<uint64_t> round) {
  uint64_t high = version > kKeepVersions ? version - kKeepVersions + 1 : 0;
  for (int rank : node_ranks) high = std::min(high, store_->LastSaved(rank).value_or(0));
  auto low = tracker_->last_committed();
  if (round && (!low || *round > *low)) low = round;
  if (high > 0) store_->ReleaseBetween(low, high);
}

}  // namespace ftrun
