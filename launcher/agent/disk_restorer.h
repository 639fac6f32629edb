// DiskRestorer: this node's part of a restore from the persist directory
// (the coordinator's kPull with from_disk), off the event loop.
//
// Reading a multi-GiB version takes longer than the coordinator waits for a
// heartbeat; so the reads run on the disk worker (disk_worker.h), one rank's
// chunks at a time, and the loop only reserves the store extents they go
// to, adds each rank's manifest once its chunks are in, and says how it
// ended (on_done). Chunks the store holds already are not read.
//
// A newer plan (another kPull) or a halt makes the restore in flight stale:
// its result is dropped when its read in flight ends, and the newer one
// starts then (a read never races another into the same store).
//
// Errors are classified once (plugin/persist/disk_errors.h): the reader has
// retried transient ones already. Only a verified corruption or a missing
// file means the version is bad (the job goes back to an older one);
// anything else (another job's or world size's files, a disk that keeps
// failing, no permission) stops the job, and nothing is deleted.
//
// Not thread-safe: owned by the agent's event loop; declared before the
// disk worker it uses, so the worker is joined first.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/common/disk_worker.h"
#include "plugin/common/clock.h"
#include "plugin/persist/env.h"
#include "plugin/protocol/cluster_messages.h"
#include "plugin/protocol/id_ranges.h"
#include "plugin/store/snapshot_store.h"

namespace ftrun {

class DiskRestorer {
 public:
  // The store reservation owner of a restore's extents.
  static constexpr uint64_t kOwner = id_ranges::kDiskRestoreOwner;

  // Where a restore reads, and this node's place in the job (as they are
  // when it begins: a replacement learns its place late).
  struct Where {
    std::string dir;  // persist.dir ("": none, and the restore fails saying so)
    std::string job_id;
    int world_size = 0;
    int node = 0;        // this node's index, for messages
    Env* env = nullptr;  // where chunks are read (nullptr: POSIX)
  };
  enum class Outcome {
    kRestored,    // every rank of the plan is in the store at its version
    kVersionBad,  // the version cannot be restored: the job goes back to an older one
    kFatal,       // no older version is an answer: the job stops, nothing deleted
  };
  struct Result {
    uint64_t epoch = 0;
    uint64_t version = 0;
    std::vector<int> ranks;  // this node's, in the plan
    Outcome outcome = Outcome::kRestored;
    std::string message;      // for the coordinator, when not restored
    uint64_t bytes_read = 0;  // chunks the store lacked, read and verified
  };

  DiskRestorer(SnapshotStore* store, char* arena_base, const ftrun::Clock& clock);

  // Called on the loop when a restore ends (never for a stale one).
  std::function<void(Result)> on_done;

  // Restores this node's ranks of `m.version` from disk, reading on
  // `worker`; after the restore in flight, if any, ended.
  void Begin(const PullMsg& m, const Where& where, DiskWorker* worker);
  // A newer plan or a halt: the restore in flight is stale, and nothing
  // waits to start.
  void Cancel();
  // A read is in flight (stale or not).
  bool busy() const { return current_.has_value(); }

 private:
  struct Restore {
    PullMsg pull;
    Where where;
    uint64_t seq = 0;
    DiskWorker* worker = nullptr;
    std::vector<int> ranks;
    std::vector<Manifest> todo;  // this node's ranks of the version, not in the store yet
    size_t next = 0;
    uint64_t bytes = 0;
    ftrun::Clock::Time t0;
  };
  void Start(const PullMsg& m, const Where& where, DiskWorker* worker);
  bool Stale();
  void Loaded(const Status& s, std::vector<Manifest> all);
  void NextRank();
  void RankRead(const Status& s, uint64_t bytes);
  void End(Status s);
  Status Reserve(Manifest* m, std::vector<ChunkRef*>* want);

  SnapshotStore* const store_;
  char* const base_;
  const ftrun::Clock& clock_;
  uint64_t seq_ = 0;                // each plan and each cancel
  std::optional<Restore> current_;  // in flight
  struct Next {
    PullMsg pull;
    Where where;
    DiskWorker* worker;
  };
  std::optional<Next> next_;  // arrived while one was in flight
};

}  // namespace ftrun
