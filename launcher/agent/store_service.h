// StoreService: answers the ranks' store requests (reserve, save, load,
// list, wait for commit) against the node's SnapshotStore. Each accepted
// save is reported (on_saved) for the coordinator, whose word the
// CommitTracker holds: what was committed.
//
// Not thread-safe: called from the agent's event loop only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>

#include "launcher/agent/connection.h"
#include "launcher/agent/version_retention.h"
#include "plugin/common/clock.h"
#include "plugin/store/snapshot_store.h"
#include "recovery/commit_tracker.h"

namespace ftrun {

class StoreService {
 public:
  // chunk_size: the largest chunk a rank may reserve or reference; `clock`:
  // where a commit wait's deadline is read (the agent's).
  StoreService(SnapshotStore* store, const CommitTracker* tracker, VersionRetention* retention, uint64_t chunk_size,
               const Clock& clock = Clock::Steady());

  // Handles one store request; false for a message type it does not own.
  // Replies (or errors) are sent on conn.
  bool Handle(Connection& conn, MsgType type, const std::string& payload);
  // The connection is gone: its reservations, pins and waits end.
  void Disconnected(Connection& conn);
  // Expires commit waits past their deadline.
  void Tick(Clock::Time now);
  // The rank behind conn is blocked waiting for a commit (not hung).
  bool Waiting(const Connection& conn) const;

  std::optional<uint64_t> last_committed() const { return tracker_->last_committed(); }
  // The coordinator committed a version: release older versions and wake
  // the ranks waiting for it.
  void OnCommitted(uint64_t version) { Committed(version); }
  // Called after each accepted save: (rank, version).
  std::function<void(int, uint64_t)> on_saved;
  // Called when a version commits.
  std::function<void(uint64_t)> on_committed;

 private:
  struct Waiter {
    Connection* conn;
    uint64_t version;
    Clock::Time deadline;
  };

  void HandleAlloc(Connection& conn, const std::string& payload);
  void HandleSave(Connection& conn, const std::string& payload);
  void HandleLoad(Connection& conn, const std::string& payload);
  void HandleLoadDone(Connection& conn, const std::string& payload);
  void HandleList(Connection& conn);
  void HandleWaitCommitted(Connection& conn, const std::string& payload);
  void Committed(uint64_t version);

  SnapshotStore* store_;
  const CommitTracker* tracker_;
  VersionRetention* retention_;
  const uint64_t chunk_size_;
  const Clock& clock_;
  std::list<Waiter> waiters_;
};

}  // namespace ftrun
