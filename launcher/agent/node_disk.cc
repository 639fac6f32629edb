#include "launcher/agent/node_disk.h"

#include "plugin/common/log.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/env.h"
#include "plugin/persist/version_scan.h"

namespace ftrun {

NodeDisk::NodeDisk(Options o, SnapshotStore* store, const ftrun::Clock& clock)
    : o_(std::move(o)), store_(store), clock_(clock) {}

void NodeDisk::Assign(int node, int world_size) {
  node_ = node;
  world_size_ = world_size;
}

void NodeDisk::Committed(uint64_t version, std::optional<uint64_t> epoch) {
  if (!enabled()) return;
  if (!flusher_) {
    Flusher::Options f;
    f.config = o_.config;
    f.job_id = o_.job_id;
    f.world_size = world_size_;
    f.node = node_;
    f.arena_base = o_.arena_base;
    f.env = o_.env;
    f.clock = &clock_;
    if (o_.leased) {
      f.marker_guard = [lease = lease_, &clock = clock_] {
        const int64_t now = clock.Now().time_since_epoch().count();
        if (now < lease->load()) return Status::Ok();
        return Status::Unavailable(
            "this agent has not heard from its coordinator lately, or was fenced (it may "
            "have been replaced)");
      };
    }
    f.ranks = o_.ranks;
    auto fl = std::make_unique<Flusher>(std::move(f), store_);
    Status s = fl->Start();
    if (s.ok() && watch) s = watch(fl->event_fd());
    if (!s.ok()) {
      FTRUN_LOG_ERROR("persist: cannot start the flusher: {}; versions stay in RAM only", s.message());
      o_.config.dir.clear();
      return;
    }
    flusher_ = std::move(fl);
  }
  flusher_->OnCommitted(version, epoch, clock_.Now());
}

void NodeDisk::OnEvent() {
  if (flusher_) flusher_->OnEvent(clock_.Now());
}

void NodeDisk::Tick(ftrun::Clock::Time now) {
  if (flusher_) flusher_->Tick(now);
}

void NodeDisk::Rewind(uint64_t version) {
  if (flusher_) flusher_->Rewind(version);
}

void NodeDisk::DropFilesAbove(uint64_t version, const std::vector<int>& ranks) {
  if (!enabled() || ranks.empty()) return;
  Env* env = PosixEnv();
  const std::string job_dir = PersistJobDir(o_.config.dir, o_.job_id);
  std::vector<uint64_t> versions;
  if (!ListVersions(env, job_dir, &versions).ok()) return;
  for (uint64_t v : versions) {
    if (v <= version) continue;
    const std::string dir = VersionDir(job_dir, v);
    std::vector<std::string> files{dir + "/" + NodeMarkerName(node_)};  // the marker first
    for (int rank : ranks) files.push_back(dir + "/" + ManifestFileName(rank));
    for (const std::string& f : files) {
      if (!env->FileExists(f)) continue;
      Status s = env->DeleteFile(f);
      if (s.ok()) s = env->SyncDir(dir);
      if (!s.ok()) FTRUN_LOG_ERROR("persist: cannot remove {}: {}", f, s.message());
    }
  }
}

void NodeDisk::Drain(std::optional<uint64_t> committed, bool fenced) {
  if (!flusher_) return;
  if (fenced) {
    FTRUN_LOG_WARN(
        "persist: not writing committed version {} before exiting: this agent was fenced out of the job "
        "(or lost the coordinator and was not re-admitted); its node may have a replacement",
        committed ? std::to_string(*committed) : "none");
    return;
  }
  if (!committed || (flusher_->last_written() && *flusher_->last_written() >= *committed)) return;
  FTRUN_LOG_INFO("persist: writing committed version {} before exiting (up to {} s)", *committed,
                 o_.config.drain_timeout.count() / 1000);
  flusher_->Drain(o_.config.drain_timeout);
}

void NodeDisk::LeaseUntil(ftrun::Clock::Time until) { lease_->store(until.time_since_epoch().count()); }

std::optional<nlohmann::json> NodeDisk::StatusJson() const {
  if (!flusher_) return std::nullopt;
  return flusher_->StatusJson();
}

}  // namespace ftrun
