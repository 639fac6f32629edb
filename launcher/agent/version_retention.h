// VersionRetention: the one place that decides which versions of the node's
// store may be freed. The agent and its store service tell it what happened
// (a commit, a halt, a start, a commit round, a save); it frees what can
// never be restored or committed and keeps the rest. The store keeps what
// is pinned (a rank loading a version, a copy or a disk write in flight)
// until it is unpinned, whatever this decides.
//
// The rules:
//  - committed v: every version below v goes (v is what restarts restore);
//  - the ranks halted: what they saved above the committed version is void;
//  - the job starts from v (a restart, a replacement's first start, a
//    return to a version on disk): everything above v is another timeline's
//    and is never restored, nor acknowledged as a copy of the new one's;
//  - a commit round targets v: versions between the committed one and v
//    will never be committed (but a rank that has not saved v keeps its
//    last save);
//  - a save while a round runs: memory stays bounded by keeping the
//    committed version, the round's, and the newest kKeepVersions saves
//    (slack for ranks a few steps apart), and never a rank's last save (its
//    next save references that one's chunks).
//
// Not thread-safe: owned by the agent's event loop.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "plugin/store/snapshot_store.h"
#include "recovery/commit_tracker.h"

namespace ftrun {

class VersionRetention {
 public:
  static constexpr uint64_t kKeepVersions = 4;

  // `tracker`: the committed version, as the coordinator said it.
  VersionRetention(SnapshotStore* store, const CommitTracker* tracker) : store_(store), tracker_(tracker) {}

  void Committed(uint64_t version);
  std::optional<uint64_t> committed() const { return tracker_->last_committed(); }
  void Halted();
  void StartsFrom(std::optional<uint64_t> version);
  // A restore of `version` from disk failed: what was read of it goes.
  void RestoreFailed(uint64_t version);
  // A commit round copies `version`; `node_ranks`: this node's ranks.
  void RoundTargets(uint64_t version, const std::vector<int>& node_ranks);
  // One of `node_ranks` saved `version`; `round`: the version the current
  // commit round copies, if any.
  void Saved(uint64_t version, const std::vector<int>& node_ranks, std::optional<uint64_t> round);

 private:
  SnapshotStore* store_;
  const CommitTracker* tracker_;
};

}  // namespace ftrun
