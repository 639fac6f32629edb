// NodeStore: this node's store, as one part of the agent. The shared-memory
// arena the ranks save into (pre-faulted on a thread at start with
// store.prefault, while the ranks start), the catalog of the snapshots in it
// (SnapshotStore), the agent's copy of the committed version
// (CommitTracker), which versions may go (VersionRetention), and the
// service that answers the ranks' store requests (StoreService). The agent
// wires what the service reports (on_saved, on_committed) to the other
// parts.
//
// Not thread-safe, but for the prefault thread, which touches only the
// arena's pages: owned by the agent's event loop.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "ftrun/status.h"
#include "launcher/agent/store_service.h"
#include "launcher/agent/version_retention.h"
#include "plugin/common/clock.h"
#include "plugin/config/config.h"
#include "plugin/store/arena.h"
#include "plugin/store/snapshot_store.h"
#include "recovery/commit_tracker.h"

namespace ftrun {

class NodeStore {
 public:
  explicit NodeStore(const ftrun::Clock& clock) : clock_(clock) {}
  ~NodeStore();  // stops the prefault and waits for it, before the arena goes
  NodeStore(const NodeStore&) = delete;
  NodeStore& operator=(const NodeStore&) = delete;

  // Creates the arena of job `job_id`'s agent `agent_id` (store.memory_budget
  // in store.chunk_size chunks), starts its prefault, and the parts over it.
  Status Open(const std::string& job_id, uint32_t agent_id, const StoreConfig& store);

  Arena& arena() { return arena_; }
  char* base() { return arena_.base(); }
  SnapshotStore* catalog() { return catalog_.get(); }
  CommitTracker* tracker() { return &tracker_; }
  VersionRetention* retention() { return retention_.get(); }
  StoreService* service() { return service_.get(); }

  // The prefault finished since the status last said (TakePrefaulted).
  bool prefault_news() const { return prefaulted_ != reported_prefaulted_; }
  // Whether the arena is pre-faulted, as the status says it from now on.
  bool TakePrefaulted() { return reported_prefaulted_ = prefaulted_; }

 private:
  const ftrun::Clock& clock_;
  Arena arena_;
  std::thread prefault_;  // populates arena_'s pages at start
  std::atomic<bool> stop_prefault_{false};
  std::atomic<bool> prefaulted_{false};
  bool reported_prefaulted_ = false;
  std::unique_ptr<SnapshotStore> catalog_;
  CommitTracker tracker_;
  std::unique_ptr<VersionRetention> retention_;  // which versions of catalog_ may go
  std::unique_ptr<StoreService> service_;
};

}  // namespace ftrun
