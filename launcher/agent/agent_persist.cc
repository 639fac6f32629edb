// The agent and the persist directory (node_disk.h): the coordinator's
// orders to go back to a version on disk (a job started again after it was
// killed whole, more nodes lost than the replicas cover, a copy corrupted
// with no good one left) drop what lies above it and read it on the disk
// worker (disk_restorer.h).
#include "launcher/agent/agent.h"
#include "launcher/agent/test_faults.h"
#include "plugin/common/log.h"

namespace ftrun {

// The coordinator found no committed version in RAM and restores `version`
// from disk: read this node's ranks of it.
void Agent::PullFromDisk(const PullMsg& m) {
  auto committed = service_->last_committed();
  if (committed && *committed > m.version) {
    // More nodes were lost than the replicas cover: the job goes back to the
    // newest version on disk. Newer versions are void, here and on disk.
    FTRUN_LOG_WARN("persist: going back from committed version {} to version {} on disk", *committed, m.version);
    disk_->Rewind(m.version);
    tracker_.Rewind(m.version);
  }
  // Whatever this node has above that version is of another timeline too,
  // even on an agent that never saw its commit (a replacement, whose pull of
  // the lost version may have finished; a node started again): in RAM it
  // would refuse the restore ("versions must increase") or be acknowledged
  // as a copy of the new timeline's. On disk (this node's marker and
  // manifests) it stays until the job commits a newer version (kDropAbove):
  // a version given up on a read error must not be lost before the job has
  // a newer one, and nothing newer is written before that commit.
  retention_->StartsFrom(m.version);
  Status s = persist() ? StartDiskWorker() : Status::Ok();
  if (!s.ok()) FTRUN_LOG_ERROR("persist: cannot start the disk worker: {}", s.message());
  DiskRestorer::Where where{disk_->dir(), o_.job_id, o_.world_size, o_.node_rank, RestoreReadEnv()};
  restorer_->Begin(m, where, s.ok() ? disk_worker_.get() : nullptr);
}

// This node's ranks of the version are in the store (the coordinator is
// told they are held, and that this node is ready), or the version cannot
// be restored (an older one is tried) or nothing can be (the job stops).
void Agent::DiskRestored(DiskRestorer::Result r) {
  if (r.outcome == DiskRestorer::Outcome::kVersionBad) {
    retention_->RestoreFailed(r.version);
    return Report(DiskFailedMsg{r.epoch, r.version, r.message});
  }
  if (r.outcome == DiskRestorer::Outcome::kFatal) {
    retention_->RestoreFailed(r.version);
    return Report(FatalMsg{r.epoch, r.message, 2});
  }
  Committed(r.version);
  HeldMsg held{r.epoch, {}};
  for (int rank : r.ranks) held.items.push_back({rank, r.version});
  Report(held);
  Report(ReadyMsg{r.epoch});
}

}  // namespace ftrun
