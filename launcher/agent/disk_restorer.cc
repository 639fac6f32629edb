#include "launcher/agent/disk_restorer.h"

#include <algorithm>
#include <memory>
#include <unordered_set>

#include "plugin/common/log.h"
#include "plugin/persist/disk_errors.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"

namespace ftrun {

DiskRestorer::DiskRestorer(SnapshotStore* store, char* arena_base, const ftrun::Clock& clock)
    : store_(store), base_(arena_base), clock_(clock) {}

void DiskRestorer::Begin(const PullMsg& m, const Where& where, DiskWorker* worker) {
  ++seq_;  // the one in flight, if any, is stale
  next_.reset();
  if (current_) {  // its read in flight ends first (Stale starts this one)
    next_ = Next{m, where, worker};
    return;
  }
  Start(m, where, worker);
}

void DiskRestorer::Cancel() {
  ++seq_;
  next_.reset();
}

void DiskRestorer::Start(const PullMsg& m, const Where& where, DiskWorker* worker) {
  Restore r;
  r.pull = m;
  r.where = where;
  r.seq = seq_;
  r.worker = worker;
  r.t0 = clock_.Now();
  for (const auto& [rank, holders] : m.ranks) r.ranks.push_back(rank);
  current_ = std::move(r);
  if (where.dir.empty()) return End(Status::FailedPrecondition("this agent has no persist.dir"));
  if (worker == nullptr) return End(Status::FailedPrecondition("the disk worker did not start"));
  auto reader = std::make_shared<PersistReader>(where.env, where.dir, where.job_id, where.world_size);
  const uint64_t version = m.version;
  worker->Submit([this, reader, version]() -> DiskWorker::Completion {
    auto all = std::make_shared<std::vector<Manifest>>();
    Status s = reader->LoadVersion(version, nullptr, all.get());
    return [this, s, all] { Loaded(s, std::move(*all)); };
  });
}

// True (and the restore dropped, the next one started) when a newer plan
// replaced it while its read was in flight.
bool DiskRestorer::Stale() {
  if (current_ && current_->seq == seq_) return false;
  store_->ReleaseReservations(kOwner);  // no read is in flight now
  if (current_) {
    FTRUN_LOG_INFO("persist: restore of version {} from disk dropped: the coordinator changed the plan",
                   current_->pull.version);
  }
  current_.reset();
  if (next_) {
    Next n = std::move(*next_);
    next_.reset();
    Start(n.pull, n.where, n.worker);
  }
  return true;
}

void DiskRestorer::Loaded(const Status& s, std::vector<Manifest> all) {
  if (Stale()) return;
  if (!s.ok()) return End(s);
  const uint64_t v = current_->pull.version;
  for (Manifest& m : all) {
    const auto& ranks = current_->ranks;
    bool mine = std::find(ranks.begin(), ranks.end(), m.rank) != ranks.end();
    if (mine && !store_->Find(m.rank, v)) current_->todo.push_back(std::move(m));
  }
  NextRank();
}

// Reserves the extents of the next rank's chunks that the store lacks and
// hands their reads to the worker.
void DiskRestorer::NextRank() {
  if (current_->next == current_->todo.size()) return End(Status::Ok());
  Manifest& m = current_->todo[current_->next];
  std::vector<ChunkRef*> want;
  if (Status s = Reserve(&m, &want); !s.ok()) {
    store_->ReleaseReservations(kOwner);
    return End(s);
  }
  std::vector<std::pair<ChunkRef, char*>> reads;
  for (ChunkRef* c : want) reads.emplace_back(*c, base_ + c->offset);
  const Where& where = current_->where;
  auto reader = std::make_shared<PersistReader>(where.env, where.dir, where.job_id, where.world_size);
  DiskWorker* worker = current_->worker;
  const std::atomic<bool>* cancelled = &worker->cancelled();
  worker->Submit([this, reader, reads = std::move(reads), cancelled]() -> DiskWorker::Completion {
    Status st;
    uint64_t bytes = 0;
    for (const auto& [ref, dst] : reads) {
      if (cancelled->load()) return nullptr;  // the agent is going away
      st = reader->ReadChunk(ref, dst);
      if (!st.ok()) break;
      bytes += ref.length;
    }
    return [this, st, bytes] { RankRead(st, bytes); };
  });
}

void DiskRestorer::RankRead(const Status& read, uint64_t bytes) {
  if (Stale()) return;
  current_->bytes += bytes;
  Manifest& m = current_->todo[current_->next];
  Status s = read.ok() ? store_->AddManifest(kOwner, m) : read;
  store_->ReleaseReservations(kOwner);
  if (!s.ok()) return End(s.Annotate("rank " + std::to_string(m.rank)));
  ++current_->next;
  NextRank();
}

void DiskRestorer::End(Status s) {
  Restore r = std::move(*current_);
  current_.reset();
  Result out;
  out.epoch = r.pull.epoch;
  out.version = r.pull.version;
  out.ranks = r.ranks;
  out.bytes_read = r.bytes;
  const uint64_t v = r.pull.version;
  const std::string node = "node " + std::to_string(r.where.node);
  for (int rank : r.ranks) {
    if (s.ok() && store_->Find(rank, v) == nullptr) {
      s = Status::NotFound("rank " + std::to_string(rank) + " is not in version " + std::to_string(v) + " on disk");
    }
  }
  if (s.ok()) {
    FTRUN_LOG_WARN(
        "persist: restored version {} of ranks {}..{} from disk ({}): {:.1f} MiB read and verified in "
        "{:.0f} ms on the disk worker; training resumes after step {}",
        v, r.ranks.empty() ? -1 : r.ranks.front(), r.ranks.empty() ? -1 : r.ranks.back(),
        PersistJobDir(r.where.dir, r.where.job_id), r.bytes / 1048576.0,
        std::chrono::duration<double, std::milli>(clock_.Now() - r.t0).count(), v);
    out.outcome = Outcome::kRestored;
  } else if (const DiskErrorClass c = ClassifyDiskError(s); c == DiskErrorClass::kVersionBad) {
    out.outcome = Outcome::kVersionBad;  // the coordinator picks an older version
    out.message = node + ": version " + std::to_string(v) + " on disk cannot be restored: " + s.message();
  } else {
    // Another job's or world size's files, a disk that keeps failing, no
    // permission: an older version is no answer. Nothing was deleted, and
    // the job stops with exit 2, as a start that cannot be made.
    out.outcome = Outcome::kFatal;
    out.message = s.code() == Code::kFailedPrecondition
                      ? node + ": " + s.message()
                      : node + " cannot restore version " + std::to_string(v) + " from disk (" + DiskErrorClassName(c) +
                            " error): " + s.message() + "; nothing was deleted: start " +
                            "the job again once the persist directory reads";
  }
  if (on_done) on_done(std::move(out));
}

// For a manifest read from disk: holds the chunks the store has already and
// reserves an extent for each distinct one it lacks (`want`, offsets set).
// The caller releases kOwner's reservations once done.
Status DiskRestorer::Reserve(Manifest* m, std::vector<ChunkRef*>* want) {
  std::vector<uint64_t> lengths;
  std::unordered_set<ChunkHash, ChunkHashHasher> seen;
  for (auto& t : m->tensors) {
    for (auto& c : t.chunks) {
      c.offset = kNoOffset;
      if (!seen.insert(c.hash).second || store_->HoldChunk(kOwner, c.hash)) continue;
      want->push_back(&c);
      lengths.push_back(c.length);
    }
  }
  std::vector<uint64_t> offsets;
  FTRUN_RETURN_IF_ERROR(store_->Reserve(kOwner, lengths, &offsets));
  for (size_t i = 0; i < want->size(); ++i) (*want)[i]->offset = offsets[i];
  return Status::Ok();
}

}  // namespace ftrun
