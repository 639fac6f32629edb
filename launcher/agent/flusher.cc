#include "launcher/agent/flusher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "plugin/common/duration.h"
#include "plugin/common/log.h"
#include "plugin/persist/retention.h"

namespace ftrun {

namespace {

constexpr auto kMaxBackoff = std::chrono::seconds(60);

}  // namespace

Flusher::Flusher(Options o, SnapshotStore* store) : o_(std::move(o)), store_(store) {}

Flusher::~Flusher() {
  if (writer_) writer_->Cancel();
  {
    std::lock_guard<std::mutex> l(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (writing_) store_->Unpin(*writing_);
  if (pending_) store_->Unpin(*pending_);
}

Status Flusher::Start() {
  env_ = o_.env;
  if (env_ == nullptr) {
    // Not into a directory another user controls (the job's state is in it).
    FTRUN_RETURN_IF_ERROR(CheckPersistRoot(o_.config.dir, o_.job_id, o_.config.file_mode));
    PosixEnvOptions e;
    e.direct_io = o_.config.direct_io;
    e.file_mode = o_.config.file_mode;
    e.dir_mode = DirModeFor(o_.config.file_mode);
    own_env_ = NewPosixEnv(e);
    env_ = own_env_.get();
  }
  PersistWriterOptions w;
  w.dir = o_.config.dir;
  w.job_id = o_.job_id;
  w.world_size = o_.world_size;
  w.node = o_.node;
  w.rate_limit = o_.config.rate_limit;
  w.env = env_;
  w.marker_guard = o_.marker_guard;
  writer_ = std::make_unique<PersistWriter>(w);
  scrubber_ = std::make_unique<ChunkScrubber>(writer_.get());
  event_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_.valid()) return Status::FromErrno("eventfd", errno);
  last_write_time_ = o_.clock->Now();
  thread_ = std::thread([this] { ThreadMain(); });
  return Status::Ok();
}

void Flusher::OnCommitted(uint64_t version, std::optional<uint64_t> epoch, Clock::Time now) {
  if (committed_ && version <= *committed_) return;
  committed_ = version;
  committed_epoch_ = epoch;
  // A version whose timeline this agent does not know (a restore point it
  // learned from a pull or a start, committed before it joined) is never
  // written by it: its marker could not say which timeline it completes.
  if (!epoch) return;
  const uint64_t every = o_.config.every_versions > 0 ? static_cast<uint64_t>(o_.config.every_versions) : 1;
  if (version % every == 0) SetPending(version, *epoch);
  MaybeStart(now, false);
}

void Flusher::SetPending(uint64_t version, uint64_t epoch) {
  if (pending_) store_->Unpin(*pending_);
  store_->Pin(version);
  pending_ = version;
  pending_epoch_ = epoch;
}

void Flusher::Tick(Clock::Time now) { MaybeStart(now, false); }

void Flusher::MaybeStart(Clock::Time now, bool ignore_backoff) {
  if (writing_ || !pending_ || paused_) return;
  if (last_written_ && *last_written_ >= *pending_) {
    store_->Unpin(*pending_);
    pending_.reset();
    return;
  }
  if (!ignore_backoff) {
    if (failures_ > 0 && now < backoff_until_) return;
    const PersistConfig& c = o_.config;
    bool by_time = c.every_seconds.count() > 0 && now - last_write_time_ >= c.every_seconds;
    if (c.every_versions == 0 && !by_time && failures_ == 0) return;
  }
  Job job;
  job.version = *pending_;
  job.epoch = pending_epoch_;
  // Decided now: a Rewind from here on makes this write unable to finish.
  job.generation = writer_->generation();
  for (int rank : o_.ranks()) {
    const Manifest* m = store_->Find(rank, job.version);
    if (m == nullptr) {
      FTRUN_LOG_WARN("persist: rank {} has no manifest of committed version {} on this node; not writing it", rank,
                     job.version);
      store_->Unpin(*pending_);
      pending_.reset();
      return;
    }
    job.manifests.push_back(*m);
  }
  if (job.manifests.empty()) {  // a spare: nothing of its own
    store_->Unpin(*pending_);
    pending_.reset();
    return;
  }
  writing_ = job.version;  // the pending pin goes with it
  pending_.reset();
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = std::move(job);
  }
  cv_.notify_all();
}

void Flusher::ThreadMain() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return quit_ || job_.has_value(); });
      if (quit_) return;
      job = std::move(*job_);
      job_.reset();
    }
    Done d;
    d.version = job.version;
    d.epoch = job.epoch;
    d.generation = job.generation;
    PersistProgress before = writer_->Progress();
    auto t0 = Wall::now();
    std::vector<const Manifest*> ptrs;
    for (const Manifest& m : job.manifests) ptrs.push_back(&m);
    const char* base = o_.arena_base;
    const ChunkSource source = [base](const ChunkRef& c, const void** data) {
      if (c.offset == kNoOffset) return Status::Corruption("chunk without a store offset");
      *data = base + c.offset;
      return Status::Ok();
    };
    d.status = writer_->WriteVersion(job.version, job.epoch, ptrs, source, job.generation);
    d.took = Wall::now() - t0;
    if (d.status.ok()) d.status = ScrubWritten(job.version, ptrs, source, &d.scrub);
    PersistProgress after = writer_->Progress();
    d.progress.bytes_written = after.bytes_written - before.bytes_written;
    d.progress.chunk_bytes_written = after.chunk_bytes_written - before.chunk_bytes_written;
    d.progress.chunk_bytes_skipped = after.chunk_bytes_skipped - before.chunk_bytes_skipped;
    if (d.status.ok() && o_.node == 0) d.retention = RunRetention(job.version);
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = std::move(d);
    }
    uint64_t one = 1;
    (void)::write(event_.get(), &one, sizeof one);
  }
}

namespace {

void LogFinding(uint64_t version, const ScrubFinding& f) {
  if (f.repair.ok()) {
    FTRUN_LOG_WARN("persist: chunk file '{}' ({} of version {}) failed its check ({}); repaired from RAM", f.path,
                   f.which, version, f.problem);
  } else if (f.repair.code() == Code::kUnavailable) {  // stopped first: the next write checks it again
    FTRUN_LOG_WARN("persist: chunk file '{}' ({} of version {}) failed its check ({}); not repaired: {}", f.path,
                   f.which, version, f.problem, f.repair.message());
  } else {
    FTRUN_LOG_ERROR("persist: chunk file '{}' ({} of version {}) failed its check ({}); not repaired: {}", f.path,
                    f.which, version, f.problem, f.repair.message());
  }
}

}  // namespace

// On the writer thread, `version` complete on disk and still pinned (so the
// RAM copies the repairs write from are valid). A stopped scrub leaves the
// version written (*note says so); a failed repair fails the write, so that
// the backoff and retry apply and the version stays pinned until then.
Status Flusher::ScrubWritten(uint64_t version, const std::vector<const Manifest*>& manifests, const ChunkSource& source,
                             std::string* note) {
  const auto t0 = Wall::now();
  const ScrubProgress before = scrubber_->Progress();
  std::vector<ScrubFinding> findings;
  Status st = scrubber_->Scrub(version, manifests, source, &findings);
  for (const ScrubFinding& f : findings) LogFinding(version, f);
  const ScrubProgress after = scrubber_->Progress();
  const uint64_t checked = after.chunks_scrubbed - before.chunks_scrubbed;
  const uint64_t repaired = after.chunks_repaired - before.chunks_repaired;
  if (checked > 0) {
    *note = "scrub: " + std::to_string(checked) + " reused chunk file(s) checked, " + std::to_string(repaired) +
            " repaired from RAM, in " + std::to_string(static_cast<int64_t>(Ms(Wall::now() - t0))) + " ms";
  }
  if (st.code() == Code::kUnavailable) {
    *note = st.message();
    return Status::Ok();
  }
  return st;
}

std::string Flusher::RunRetention(uint64_t protect) {
  RetentionOptions r;
  r.dir = o_.config.dir;
  r.job_id = o_.job_id;
  r.keep = o_.config.keep;
  r.protect = protect;
  r.node = o_.node;
  r.env = env_;
  RetentionResult res;
  Status s = ApplyRetention(r, &res);
  if (!s.ok()) return "retention failed: " + s.message();
  if (res.deleted.empty()) return "";
  return "retention deleted " + std::to_string(res.deleted.size()) + " older version(s), " +
         std::to_string(res.chunks_deleted) + " chunk file(s)";
}

void Flusher::OnEvent(Clock::Time now) {
  uint64_t n;
  while (::read(event_.get(), &n, sizeof n) > 0) {
  }
  std::optional<Done> d;
  {
    std::lock_guard<std::mutex> l(mu_);
    d = std::move(done_);
    done_.reset();
  }
  if (!d) return;
  writing_.reset();
  if (d->generation != writer_->generation()) {
    // Started before a Rewind (the job went back below it, or a Drain gave
    // up on it): whatever it did is of a timeline the job left. Its marker
    // was never written (the writer checks the generation under its lock);
    // nothing of it counts, and it is not retried.
    store_->Unpin(d->version);
    FTRUN_LOG_WARN("persist: a write of version {} stopped by a go-back or a stop ended ({}); discarded", d->version,
                   d->status.ok() ? "finished" : d->status.message());
    MaybeStart(now, false);
    return;
  }
  const bool failed = !d->status.ok() && d->status.code() != Code::kUnavailable;
  if (failed && !pending_ && !paused_) {
    pending_ = d->version;  // retried (its pin kept), unless a newer one is waiting
    pending_epoch_ = d->epoch;
  } else {
    store_->Unpin(d->version);
  }
  totals_.bytes_written += d->progress.bytes_written;
  totals_.chunk_bytes_skipped += d->progress.chunk_bytes_skipped;
  if (d->status.ok()) {
    last_written_ = d->version;
    ++totals_.versions_written;
    last_write_time_ = now;
    totals_.last_rate_mb_s = d->took.count() > 0 ? d->progress.bytes_written / 1e6 / (d->took.count() / 1e9) : 0;
    if (failures_ > 0) FTRUN_LOG_WARN("persist: the disk works again after {} failed write(s)", failures_);
    failures_ = 0;
    last_error_.clear();
    FTRUN_LOG_INFO("persist: version {} on disk in {:.0f} ms ({:.1f} MiB written, {:.1f} MiB already there){}{}{}{}",
                   d->version, Ms(d->took), d->progress.bytes_written / 1048576.0,
                   d->progress.chunk_bytes_skipped / 1048576.0, d->scrub.empty() ? "" : "; ", d->scrub,
                   d->retention.empty() ? "" : "; ", d->retention);
  } else if (d->status.code() == Code::kUnavailable) {
    FTRUN_LOG_WARN("persist: writing version {} stopped: {}", d->version, d->status.message());
  } else {
    ++failures_;
    last_error_ = d->status.message();
    auto backoff =
        std::min<std::chrono::milliseconds>(std::chrono::seconds(1) * (1 << std::min(failures_ - 1, 6)), kMaxBackoff);
    backoff_until_ = now + backoff;
    FTRUN_LOG_WARN("persist: writing version {} failed ({}); training goes on from RAM, retry in {} s", d->version,
                   last_error_, backoff.count() / 1000);
  }
  MaybeStart(now, false);
}

std::optional<uint64_t> Flusher::Drain(std::chrono::milliseconds bound) {
  auto deadline = Wall::now() + bound;
  // The job ends: the last version on disk matters more than checking the
  // chunk files it reuses (the next start checks them).
  scrubber_->Stop();
  struct ResumeScrubs {
    ChunkScrubber* s;
    ~ResumeScrubs() { s->Resume(); }
  } resume{scrubber_.get()};
  if (committed_ && committed_epoch_ && (!last_written_ || *last_written_ < *committed_) &&
      (!pending_ || *pending_ < *committed_)) {
    SetPending(*committed_, *committed_epoch_);  // the end of the job: the last committed version, aligned or not
  }
  while (true) {
    if (!writing_) MaybeStart(o_.clock->Now(), true);
    if (!writing_) return last_written_;
    const auto wall = Wall::now();
    if (wall >= deadline) break;
    pollfd p{event_.get(), POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - wall).count();
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200)));
    std::optional<uint64_t> before = writing_;
    OnEvent(o_.clock->Now());
    if (before && !writing_ && failures_ > 0) return last_written_;  // the disk fails: no point waiting
  }
  FTRUN_LOG_WARN("persist: version {} not on disk after {} ms; stopping the write (newest on disk from this node: {})",
                 *writing_, bound.count(), last_written_ ? std::to_string(*last_written_) : "none");
  writer_->Cancel();  // the thread stops between writes and says so
  pollfd p{event_.get(), POLLIN, 0};
  ::poll(&p, 1, 5000);
  OnEvent(o_.clock->Now());
  return last_written_;
}

void Flusher::Rewind(uint64_t version) {
  paused_ = true;  // nothing new starts while the write in progress ends
  if (pending_ && *pending_ > version) {
    store_->Unpin(*pending_);
    pending_.reset();
  }
  // Always, even with nothing being written: a job handed to the thread
  // (or one that ends after the wait below) carries the generation from
  // before this Cancel, so its marker can never be written (PersistWriter::
  // WriteMarker) and OnEvent discards it.
  writer_->Cancel();
  if (writing_) {
    pollfd p{event_.get(), POLLIN, 0};
    while (writing_ && ::poll(&p, 1, 10000) > 0) OnEvent(o_.clock->Now());
    if (writing_) {
      FTRUN_LOG_WARN(
          "persist: the write of version {} did not stop within 10 s of the go-back to version {}; it can "
          "no longer complete (its marker is never written) and is discarded when it ends",
          *writing_, version);
    }
  }
  writer_->ClearCancel();
  paused_ = false;
  if (committed_ && *committed_ > version) {
    committed_ = version;
    committed_epoch_.reset();  // a restore point (on disk already): not written by this agent
  }
  if (last_written_ && *last_written_ > version) last_written_ = version;
}

nlohmann::json Flusher::StatusJson() const {
  nlohmann::json j;
  j["dir"] = o_.config.dir;
  j["state"] = writing_ ? "writing" : failures_ > 0 ? "backing off" : "idle";
  j["writing_version"] = writing_ ? nlohmann::json(*writing_) : nlohmann::json(nullptr);
  j["last_written_version"] = last_written_ ? nlohmann::json(*last_written_) : nlohmann::json(nullptr);
  uint64_t backlog = 0;
  if (committed_) backlog = last_written_ ? *committed_ - std::min(*committed_, *last_written_) : *committed_ + 1;
  j["backlog_versions"] = backlog;  // committed versions newer than the newest on disk
  j["versions_written"] = totals_.versions_written;
  j["bytes_written"] = totals_.bytes_written;
  j["bytes_skipped"] = totals_.chunk_bytes_skipped;
  j["last_rate_mb_s"] = totals_.last_rate_mb_s;
  const ScrubProgress scrub = scrubber_ ? scrubber_->Progress() : ScrubProgress{};
  j["chunks_scrubbed"] = scrub.chunks_scrubbed;  // reused chunk files read back and checked
  j["bytes_scrubbed"] = scrub.bytes_scrubbed;
  j["chunks_scrub_failed"] = scrub.chunks_bad;   // failed the check: corrupt, wrong size, missing
  j["chunks_repaired"] = scrub.chunks_repaired;  // of those, rewritten from RAM
  j["chunk_repairs_failed"] = scrub.repairs_failed;
  j["failures_in_a_row"] = failures_;
  j["last_error"] = last_error_;
  return j;
}

}  // namespace ftrun
