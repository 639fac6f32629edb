// The agent and the persist directory: the lazy flusher (flusher.h) is fed
// every commit; the coordinator's orders to go back to a version on disk
// (a job started again after it was killed whole, more nodes lost than the
// replicas cover, a copy corrupted with no good one left) drop what lies
// above it and read it on the disk worker (agent_restore.cc).
#include <unistd.h>

#include <algorithm>
#include <unordered_set>

#include "launcher/agent/agent.h"
#include "launcher/agent/test_faults.h"
#include "plugin/common/log.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/version_scan.h"

namespace ftrun {

bool Agent::persist() const { return !o_.config.persist.dir.empty(); }

void Agent::PersistCommitted(uint64_t version) {
  if (!persist() || ranks_->slots().empty()) return;
  if (!flusher_) {
    Flusher::Options f;
    f.config = o_.config.persist;
    f.job_id = o_.job_id;
    f.world_size = o_.world_size;
    f.node = o_.node_rank;
    f.arena_base = arena_.base();
    if (remote()) {
      // The lease (agent_cluster.cc): a marker only while the coordinator was
      // heard lately and has not fenced this agent. Checked on the writer
      // thread right before the rename, so a write in flight while this
      // agent was frozen or cut off cannot complete after it was replaced.
      f.marker_guard = [lease = marker_lease_, &clock = clock_] {
        const int64_t now = clock.Now().time_since_epoch().count();
        if (now < lease->load()) return Status::Ok();
        return Status::Unavailable(
            "this agent has not heard from its coordinator lately, or was fenced (it may "
            "have been replaced)");
      };
    }
    f.ranks = [this] { return ranks_->Ranks(); };
    auto fl = std::make_unique<Flusher>(std::move(f), store_.get());
    Status s = fl->Start();
    if (s.ok()) s = loop_.Add(fl->event_fd(), kFlushTag);
    if (!s.ok()) {
      FTRUN_LOG_ERROR("persist: cannot start the flusher: {}; versions stay in RAM only", s.message());
      o_.config.persist.dir.clear();
      return;
    }
    flusher_ = std::move(fl);
  }
  flusher_->OnCommitted(version, commit_epoch_, clock_.Now());
}

void Agent::DrainPersist() {
  if (!flusher_) return;
  if (fenced_) {
    // Its node may belong to a replacement now, which went back below this
    // version and dropped this node's files above it: writing the old
    // committed version would put a marker of the old timeline there.
    FTRUN_LOG_WARN(
        "persist: not writing committed version {} before exiting: this agent was fenced out of the job "
        "(or lost the coordinator and was not re-admitted); its node may have a replacement",
        service_->last_committed() ? std::to_string(*service_->last_committed()) : "none");
    return;
  }
  auto committed = service_->last_committed();
  if (!committed || (flusher_->last_written() && *flusher_->last_written() >= *committed)) return;
  FTRUN_LOG_INFO("persist: writing committed version {} before exiting (up to {} s)", *committed,
                 o_.config.persist.drain_timeout.count() / 1000);
  flusher_->Drain(o_.config.persist.drain_timeout);
}

// The coordinator found no committed version in RAM and restores `version`
// from disk: read this node's ranks of it.
void Agent::PullFromDisk(const PullMsg& m) {
  auto committed = service_->last_committed();
  if (committed && *committed > m.version) {
    // More nodes were lost than the replicas cover: the job goes back to the
    // newest version on disk. Newer versions are void, here and on disk.
    FTRUN_LOG_WARN("persist: going back from committed version {} to version {} on disk", *committed, m.version);
    if (flusher_) flusher_->Rewind(m.version);
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
  DiskRestorer::Where where{o_.config.persist.dir, o_.job_id, o_.world_size, o_.node_rank, RestoreReadEnv()};
  restorer_->Begin(m, where, s.ok() ? disk_worker_.get() : nullptr);
}

// This node's marker and its ranks' manifests in versions above `version`:
// a version of the old timeline must never be completed by the new one, and
// the new one writes its own manifests there. (Each node removes its own
// files, so nodes never race on a name; retention removes the rest.)
void Agent::DropFilesAbove(uint64_t version, const std::vector<int>& ranks) {
  Env* env = PosixEnv();
  const std::string job_dir = PersistJobDir(o_.config.persist.dir, o_.job_id);
  std::vector<uint64_t> versions;
  if (!ListVersions(env, job_dir, &versions).ok()) return;
  for (uint64_t v : versions) {
    if (v <= version) continue;
    const std::string dir = VersionDir(job_dir, v);
    std::vector<std::string> files{dir + "/" + NodeMarkerName(o_.node_rank)};  // the marker first
    for (int rank : ranks) files.push_back(dir + "/" + ManifestFileName(rank));
    for (const std::string& f : files) {
      if (!env->FileExists(f)) continue;
      Status s = env->DeleteFile(f);
      if (s.ok()) s = env->SyncDir(dir);
      if (!s.ok()) FTRUN_LOG_ERROR("persist: cannot remove {}: {}", f, s.message());
    }
  }
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
  tracker_.Committed(r.version);
  service_->OnCommitted(r.version);
  HeldMsg held{r.epoch, {}};
  for (int rank : r.ranks) held.items.push_back({rank, r.version});
  Report(held);
  Report(ReadyMsg{r.epoch});
}

}  // namespace ftrun
