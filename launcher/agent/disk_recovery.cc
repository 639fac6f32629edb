#include "launcher/agent/disk_recovery.h"

#include "launcher/agent/test_faults.h"
#include "launcher/common/disk_scan.h"
#include "plugin/common/log.h"

namespace ftrun {

DiskRecovery::DiskRecovery(Parts parts, std::function<Place()> place, std::function<void(uint64_t)> committed,
                           const Clock& clock)
    : p_(parts),
      place_(std::move(place)),
      committed_(std::move(committed)),
      restorer_(parts.store, parts.arena_base, clock) {
  restorer_.on_done = [this](DiskRestorer::Result r) { Restored(std::move(r)); };
}

DiskRecovery::~DiskRecovery() = default;

Status DiskRecovery::StartWorker() {
  if (worker_) return Status::Ok();
  auto w = std::make_unique<DiskWorker>();
  FTRUN_RETURN_IF_ERROR(w->Start());
  FTRUN_RETURN_IF_ERROR(p_.loop->Add(w->event_fd(), p_.tag));
  worker_ = std::move(w);
  return Status::Ok();
}

void DiskRecovery::OnEvent() {
  if (worker_) worker_->RunCompleted();
}

void DiskRecovery::Scan(std::function<void(const Status&, const std::vector<uint64_t>&)> done) {
  if (Status s = StartWorker(); !s.ok()) return done(s, {});
  const Place place = place_();
  worker_->Submit([done = std::move(done), dir = p_.disk->dir(), place] {
    std::vector<uint64_t> versions;
    Status s = ScanDiskVersions(dir, place.job_id, place.world_size, &versions);
    return DiskWorker::Completion([done, s, versions] { done(s, versions); });
  });
}

// The coordinator found no committed version in RAM and restores `version`
// from disk: read this node's ranks of it.
void DiskRecovery::Pull(const PullMsg& m) {
  auto committed = p_.tracker->last_committed();
  if (committed && *committed > m.version) {
    // More nodes were lost than the replicas cover: the job goes back to the
    // newest version on disk. Newer versions are void, here and on disk.
    FTRUN_LOG_WARN("persist: going back from committed version {} to version {} on disk", *committed, m.version);
    p_.disk->Rewind(m.version);
    p_.tracker->Rewind(m.version);
  }
  // Whatever this node has above that version is of another timeline too,
  // even on an agent that never saw its commit (a replacement, whose pull of
  // the lost version may have finished; a node started again): in RAM it
  // would refuse the restore ("versions must increase") or be acknowledged
  // as a copy of the new timeline's. On disk (this node's marker and
  // manifests) it stays until the job commits a newer version (kDropAbove):
  // a version given up on a read error must not be lost before the job has
  // a newer one, and nothing newer is written before that commit.
  p_.retention->StartsFrom(m.version);
  Status s = p_.disk->enabled() ? StartWorker() : Status::Ok();
  if (!s.ok()) FTRUN_LOG_ERROR("persist: cannot start the disk worker: {}", s.message());
  const Place place = place_();
  DiskRestorer::Where where{p_.disk->dir(), place.job_id, place.world_size, place.node_rank, RestoreReadEnv()};
  restorer_.Begin(m, where, s.ok() ? worker_.get() : nullptr);
}

// This node's ranks of the version are in the store (the coordinator is
// told they are held, and that this node is ready), or the version cannot
// be restored (an older one is tried) or nothing can be (the job stops).
void DiskRecovery::Restored(DiskRestorer::Result r) {
  if (r.outcome == DiskRestorer::Outcome::kVersionBad) {
    p_.retention->RestoreFailed(r.version);
    return Report(DiskFailedMsg{r.epoch, r.version, r.message});
  }
  if (r.outcome == DiskRestorer::Outcome::kFatal) {
    p_.retention->RestoreFailed(r.version);
    return Report(FatalMsg{r.epoch, r.message, 2});
  }
  committed_(r.version);
  HeldMsg held{r.epoch, {}};
  for (int rank : r.ranks) held.items.push_back({rank, r.version});
  Report(held);
  Report(ReadyMsg{r.epoch});
}

}  // namespace ftrun
