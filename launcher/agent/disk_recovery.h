// DiskRecovery: this node's restores from persist.dir as the coordinator
// orders them (a kPull from disk: the job started again after it was killed
// whole, more nodes were lost than the replicas cover, or a copy was
// corrupted with no good one left). A go-back first voids what lies above
// the version; the reads run on the disk worker (disk_restorer.h); the end
// is reported to the coordinator: the ranks held and the node ready, a
// version that cannot be restored (the job tries an older one), or a fatal
// error (the job stops). A one-node job's coordinator has persist.dir
// scanned on the same worker.
//
// Not thread-safe: driven by the agent's event loop. Declared after the
// store's memory it reads into: its worker is joined first.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/cluster_member.h"
#include "launcher/agent/disk_restorer.h"
#include "launcher/agent/node_disk.h"
#include "launcher/agent/version_retention.h"
#include "launcher/common/disk_worker.h"
#include "launcher/common/event_loop.h"
#include "recovery/commit_tracker.h"

namespace ftrun {

class DiskRecovery {
 public:
  struct Parts {  // each outliving this
    SnapshotStore* store = nullptr;
    char* arena_base = nullptr;
    NodeDisk* disk = nullptr;
    CommitTracker* tracker = nullptr;
    VersionRetention* retention = nullptr;
    ClusterMember* member = nullptr;
    EventLoop* loop = nullptr;  // watches the worker's completions, under `tag`
    uint64_t tag = 0;
  };
  // This node's place (as it is when a restore begins: a replacement learns
  // its place late).
  struct Place {
    std::string job_id;
    int world_size = 0;
    int node_rank = 0;
  };

  // `committed`: the agent learns that a version is committed (what it
  // restored).
  DiskRecovery(Parts parts, std::function<Place()> place, std::function<void(uint64_t)> committed, const Clock& clock);
  ~DiskRecovery();

  // Reads this node's ranks of `m.version` from persist.dir.
  void Pull(const PullMsg& m);
  // A newer plan or a halt: the restore in flight is stale.
  void Cancel() { restorer_.Cancel(); }
  // Scans persist.dir for complete versions, newest first, off the loop.
  void Scan(std::function<void(const Status&, const std::vector<uint64_t>&)> done);
  // The worker's completions (the loop's `tag`).
  void OnEvent();

 private:
  Status StartWorker();
  void Restored(DiskRestorer::Result r);
  template <class M>
  void Report(const M& m) {
    p_.member->Report(m);
  }

  const Parts p_;
  const std::function<Place()> place_;
  const std::function<void(uint64_t)> committed_;
  DiskRestorer restorer_;
  std::unique_ptr<DiskWorker> worker_;  // after restorer_: joined (its reads cancelled) first
};

}  // namespace ftrun
