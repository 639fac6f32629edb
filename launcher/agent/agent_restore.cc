// A node's restore from the persist directory, off the event loop.
// Reading a multi-GiB version takes longer than the coordinator waits for a
// heartbeat; so the reads run on the disk worker (disk_worker.h), a rank's
// chunks at a time, and the loop only reserves the store extents they go to,
// adds each rank's manifest once its chunks are in, and reports the end.
//
// Errors are classified once (plugin/persist/disk_errors.h): the reader has
// retried transient ones already. Only a verified corruption or a missing
// file tells the coordinator the version is bad (kDiskFailed: the job goes
// back to an older one, and keeps this one's files until it commits a newer
// version); anything else stops the job with the error and deletes nothing.

#include <cerrno>
#include <memory>
#include <unordered_set>

#include "launcher/agent/agent.h"
#include "launcher/agent/test_faults.h"
#include "launcher/common/disk_worker.h"
#include "plugin/common/log.h"
#include "plugin/persist/disk_errors.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {

void Agent::BeginDiskRestore(const PullMsg& m) {
  DiskRestore r;
  r.pull = m;
  r.seq = pull_seq_;
  r.t0 = clock_.Now();
  for (const auto& [rank, holders] : m.ranks) r.ranks.push_back(rank);
  restore_ = std::move(r);
  if (!persist()) return DiskRestoreEnd(Status::FailedPrecondition("this agent has no persist.dir"));
  if (Status s = StartDiskWorker(); !s.ok()) return DiskRestoreEnd(s);
  auto reader = std::make_shared<PersistReader>(RestoreReadEnv(), o_.config.persist.dir, o_.job_id, o_.world_size);
  const uint64_t version = m.version;
  disk_worker_->Submit([this, reader, version]() -> DiskWorker::Completion {
    auto all = std::make_shared<std::vector<Manifest>>();
    Status s = reader->LoadVersion(version, nullptr, all.get());
    return [this, s, all] { DiskRestoreLoaded(s, std::move(*all)); };
  });
}

// True (and the restore dropped, the next one started) when a newer plan
// replaced it while its read was in flight.
bool Agent::DiskRestoreStale() {
  if (restore_ && restore_->seq == pull_seq_) return false;
  store_->ReleaseReservations(kDiskOwner);  // no read is in flight now
  if (restore_) {
    FTRUN_LOG_INFO("persist: restore of version {} from disk dropped: the coordinator changed the plan",
                   restore_->pull.version);
  }
  restore_.reset();
  if (next_restore_) {
    PullMsg m = std::move(*next_restore_);
    next_restore_.reset();
    PullFromDisk(m);
  }
  return true;
}

void Agent::DiskRestoreLoaded(const Status& s, std::vector<Manifest> all) {
  if (DiskRestoreStale()) return;
  if (!s.ok()) return DiskRestoreEnd(s);
  const uint64_t v = restore_->pull.version;
  for (Manifest& m : all) {
    bool mine = std::find(restore_->ranks.begin(), restore_->ranks.end(), m.rank) != restore_->ranks.end();
    if (mine && !store_->Find(m.rank, v)) restore_->todo.push_back(std::move(m));
  }
  DiskRestoreNextRank();
}

// Reserves the extents of the next rank's chunks that the store lacks and
// hands their reads to the worker.
void Agent::DiskRestoreNextRank() {
  if (restore_->next == restore_->todo.size()) return DiskRestoreEnd(Status::Ok());
  Manifest& m = restore_->todo[restore_->next];
  std::vector<ChunkRef*> want;
  if (Status s = ReserveForDisk(&m, &want); !s.ok()) {
    store_->ReleaseReservations(kDiskOwner);
    return DiskRestoreEnd(s);
  }
  std::vector<std::pair<ChunkRef, char*>> reads;
  for (ChunkRef* c : want) reads.emplace_back(*c, arena_.base() + c->offset);
  auto reader = std::make_shared<PersistReader>(RestoreReadEnv(), o_.config.persist.dir, o_.job_id, o_.world_size);
  const std::atomic<bool>* cancelled = &disk_worker_->cancelled();
  disk_worker_->Submit([this, reader, reads = std::move(reads), cancelled]() -> DiskWorker::Completion {
    Status st;
    uint64_t bytes = 0;
    for (const auto& [ref, dst] : reads) {
      if (cancelled->load()) return nullptr;  // the agent is going away
      st = reader->ReadChunk(ref, dst);
      if (!st.ok()) break;
      bytes += ref.length;
    }
    return [this, st, bytes] { DiskRestoreRankRead(st, bytes); };
  });
}

void Agent::DiskRestoreRankRead(const Status& read, uint64_t bytes) {
  if (DiskRestoreStale()) return;
  restore_->bytes += bytes;
  Manifest& m = restore_->todo[restore_->next];
  Status s = read.ok() ? store_->AddManifest(kDiskOwner, m) : read;
  store_->ReleaseReservations(kDiskOwner);
  if (!s.ok()) return DiskRestoreEnd(s.Annotate("rank " + std::to_string(m.rank)));
  ++restore_->next;
  DiskRestoreNextRank();
}

void Agent::DiskRestoreEnd(Status s) {
  DiskRestore r = std::move(*restore_);
  restore_.reset();
  const uint64_t v = r.pull.version;
  const std::string node = "node " + std::to_string(o_.node_rank);
  for (int rank : r.ranks) {
    if (s.ok() && store_->Find(rank, v) == nullptr) {
      s = Status::NotFound("rank " + std::to_string(rank) + " is not in version " + std::to_string(v) + " on disk");
    }
  }
  if (!s.ok()) {
    retention_->RestoreFailed(v);
    const DiskErrorClass c = ClassifyDiskError(s);
    if (c == DiskErrorClass::kVersionBad) {  // the coordinator picks an older version
      return Report(DiskFailedMsg{
          r.pull.epoch, v, node + ": version " + std::to_string(v) + " on disk cannot be restored: " + s.message()});
    }
    // Another job's or world size's files, a disk that keeps failing, no
    // permission: an older version is no answer. Nothing was deleted, and
    // the job stops with exit 2, as a start that cannot be made.
    std::string msg = s.code() == Code::kFailedPrecondition
                          ? node + ": " + s.message()
                          : node + " cannot restore version " + std::to_string(v) + " from disk (" +
                                DiskErrorClassName(c) + " error): " + s.message() + "; nothing was deleted: start " +
                                "the job again once the persist directory reads";
    return Report(FatalMsg{r.pull.epoch, msg, 2});
  }
  FTRUN_LOG_WARN(
      "persist: restored version {} of ranks {}..{} from disk ({}): {:.1f} MiB read and verified in "
      "{:.0f} ms on the disk worker; training resumes after step {}",
      v, r.ranks.front(), r.ranks.back(), PersistJobDir(o_.config.persist.dir, o_.job_id), r.bytes / 1048576.0,
      std::chrono::duration<double, std::milli>(clock_.Now() - r.t0).count(), v);
  tracker_.Committed(v);
  service_->OnCommitted(v);
  HeldMsg held{r.pull.epoch, {}};
  for (int rank : r.ranks) held.items.push_back({rank, v});
  Report(held);
  Report(ReadyMsg{r.pull.epoch});
}

}  // namespace ftrun
