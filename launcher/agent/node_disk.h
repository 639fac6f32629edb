// NodeDisk: this node's side of the persist directory. Every commit goes to
// the lazy flusher (flusher.h, started at the first); a job that goes back
// to a version on disk rewinds it, and each node removes its own marker and
// manifests above that version; a clean exit drains the last committed
// version to disk, unless this agent was fenced (its node may have a
// replacement, which must not find a marker of the old timeline there).
//
// In a multi-node job a marker is written only under a lease: while the
// coordinator was heard lately and has not fenced this agent (renewed by
// every coordinator message). The writer thread checks it right before the
// rename, so a write in flight while this agent was frozen or cut off
// cannot complete after it was replaced.
//
// Not thread-safe (but the lease, read on the writer thread): owned by the
// agent's event loop.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/flusher.h"
#include "plugin/common/clock.h"
#include "plugin/config/config.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class NodeDisk {
 public:
  struct Options {
    PersistConfig config;  // config.dir "": no persist directory (everything here is a no-op)
    std::string job_id;
    const char* arena_base = nullptr;
    bool leased = false;                      // markers only under the coordinator's lease
    std::function<std::vector<int>()> ranks;  // this node's ranks, asked at each write
    Env* env = nullptr;                       // the flusher's (nullptr: POSIX)
  };

  NodeDisk(Options o, SnapshotStore* store, const ftrun::Clock& clock);

  bool enabled() const { return !o_.config.dir.empty(); }
  const std::string& dir() const { return o_.config.dir; }
  // This node's place in the job (a multi-node job's coordinator assigns it
  // before the first commit).
  void Assign(int node, int world_size);

  // Adds the flusher's event fd to the agent's loop (OnEvent when readable).
  std::function<Status(int fd)> watch;

  // A version committed, in `epoch` when known (see Flusher::OnCommitted).
  // The first starts the flusher; if it cannot start, the job goes on with
  // versions in RAM only (enabled() turns false).
  void Committed(uint64_t version, std::optional<uint64_t> epoch);
  void OnEvent();
  void Tick(ftrun::Clock::Time now);
  // The job goes back to `version` on disk: newer commits are forgotten.
  void Rewind(uint64_t version);
  // This node's marker and its `ranks`' manifests in versions above
  // `version`: a version of the old timeline must never be completed by the
  // new one. (Each node removes its own files, so nodes never race on a
  // name; retention removes the rest.)
  void DropFilesAbove(uint64_t version, const std::vector<int>& ranks);
  // Before a clean exit: writes `committed` if it is not on disk yet (up to
  // persist.drain_timeout); nothing when `fenced`.
  void Drain(std::optional<uint64_t> committed, bool fenced);

  // The lease: until `until`, no lease at all, or forever (the coordinator
  // ended the job: nobody replaces this node).
  void LeaseUntil(ftrun::Clock::Time until);
  void EndLease() { lease_->store(0); }
  void LeaseForever() { lease_->store(INT64_MAX); }

  // The status's "persist" (none before the flusher started).
  std::optional<nlohmann::json> StatusJson() const;

 private:
  Options o_;
  int node_ = 0;
  int world_size_ = 0;
  SnapshotStore* const store_;
  const ftrun::Clock& clock_;
  // Steady-clock ticks until which markers may be written. Shared with the
  // flusher's writer thread (its marker guard).
  std::shared_ptr<std::atomic<int64_t>> lease_ = std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<Flusher> flusher_;
};

}  // namespace ftrun
