// PersistWriter: one committed version to disk, in crash-safe order.
#include "plugin/persist/persist_writer.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/io_workers.h"

namespace ftrun {
namespace {

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// A hint, not data, so not through Env: asks ext4 to spread the
// subdirectories of `dir` over its block groups as it does the top-level
// ones (chattr +T). Every chunk file is created in one of chunks/'s 256
// subdirectories, and a new inode goes to its directory's group; without
// the hint they all share a few groups. On an ext4 without a journal (this
// project's disk) every new inode is found by scanning the group for free
// ones that were not deleted in the last minute, and retention deletes a
// whole version of chunk files at a time: packed in a few groups, each
// create scanned thousands (~0.5 ms of CPU, not preemptible); spread, a
// version costs the flusher a third less CPU. Filesystems without the flag
// refuse it; that is fine.
void SpreadSubdirectories(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  int flags = 0;
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_TOPDIR_FL) == 0) {
    flags |= FS_TOPDIR_FL;
    (void)::ioctl(fd, FS_IOC_SETFLAGS, &flags);
  }
  ::close(fd);
}

}  // namespace

PersistWriter::PersistWriter(PersistWriterOptions options)
    : options_(std::move(options)),
      env_(options_.env != nullptr ? options_.env : PosixEnv()),
      job_dir_(PersistJobDir(options_.dir, options_.job_id)),
      limiter_(options_.rate_limit, options_.burst) {}

void PersistWriter::Cancel() {
  {
    std::lock_guard<std::mutex> marker(marker_mu_);  // waits for a marker rename in progress
    ++generation_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  cancel_ = true;
  cv_.notify_all();
}

uint64_t PersistWriter::generation() const {
  std::lock_guard<std::mutex> marker(marker_mu_);
  return generation_;
}

void PersistWriter::ClearCancel() { cancel_ = false; }

PersistProgress PersistWriter::Progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

void PersistWriter::Count(uint64_t PersistProgress::*field, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_.*field += n;
}

Status PersistWriter::Stopped() const {
  return Status::Unavailable("persist: writing " + writing_ + " to '" + job_dir_ + "' stopped (cancelled)");
}

Status PersistWriter::Pace(uint64_t n, const std::atomic<bool>* stop) {
  auto stopped = [&] { return cancel_.load() || (stop != nullptr && stop->load()); };
  if (stopped()) return Stopped();
  auto now = options_.clock ? options_.clock() : std::chrono::steady_clock::now();
  std::chrono::nanoseconds wait = limiter_.Debit(n, now);
  if (wait.count() <= 0) return Status::Ok();
  Count(&PersistProgress::throttle_ns, static_cast<uint64_t>(wait.count()));
  if (options_.sleep) {
    options_.sleep(wait);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, stopped);
  }
  return stopped() ? Stopped() : Status::Ok();
}

void PersistWriter::Interrupt() {
  std::lock_guard<std::mutex> lock(mu_);  // a waiter checks its stop flag under mu_: no lost wakeup
  cv_.notify_all();
}

Status PersistWriter::CheckArgs(uint64_t version, const std::vector<const Manifest*>& manifests) const {
  const std::string what = "persist: cannot write " + writing_ + " to '" + options_.dir + "': ";
  if (options_.dir.empty()) return Status::InvalidArgument(what + "no persist dir given");
  if (options_.job_id.empty() || options_.job_id.find('/') != std::string::npos || options_.job_id[0] == '.') {
    return Status::InvalidArgument(what + "job id '" + options_.job_id + "' cannot name a directory");
  }
  if (options_.world_size <= 0 || options_.node < 0) {
    return Status::InvalidArgument(what + "world size " + std::to_string(options_.world_size) + " and node " +
                                   std::to_string(options_.node) + " must be > 0 and >= 0");
  }
  if (manifests.empty()) return Status::InvalidArgument(what + "no manifests given");
  std::set<int> ranks;
  for (const Manifest* m : manifests) {
    if (m->version != version) {
      return Status::InvalidArgument(what + "rank " + std::to_string(m->rank) + "'s manifest is for version " +
                                     std::to_string(m->version));
    }
    if (m->rank < 0 || m->rank >= options_.world_size) {
      return Status::InvalidArgument(what + "rank " + std::to_string(m->rank) + " is outside world size " +
                                     std::to_string(options_.world_size));
    }
    if (!ranks.insert(m->rank).second) {
      return Status::InvalidArgument(what + "rank " + std::to_string(m->rank) + " given twice");
    }
  }
  return Status::Ok();
}

void PersistWriter::NeedDir(const std::string& d, SyncPlan* plan) const {
  // A directory's name is durable once its parent was synced after it was
  // made. One made by an earlier, failed call is not known to be: sync its
  // parent too. Version directories are new each time.
  if (durable_dirs_.count(d)) return;
  plan->dirs.insert(Parent(d));
  plan->now_durable.push_back(d);
}

Status PersistWriter::MakeDirs(uint64_t version, SyncPlan* plan) {
  const std::string vdir = VersionDir(job_dir_, version);
  const std::string chunks = ChunksDir(job_dir_);
  for (const std::string& d : {options_.dir, job_dir_, chunks, vdir}) {
    bool created = false;
    FTRUN_RETURN_IF_ERROR(env_->CreateDir(d, &created));
    if (created && d == chunks) SpreadSubdirectories(d);
    if (d != vdir) NeedDir(d, plan);
  }
  plan->dirs.insert(job_dir_);  // the version directory's name
  plan->dirs.insert(vdir);      // the manifests' and chunks' names
  return Status::Ok();
}

Status PersistWriter::WriteFileAtomically(const std::string& path, const std::vector<Piece>& pieces) {
  const std::string tmp = TmpName(path, options_.node);
  std::unique_ptr<WritableFile> f;
  FTRUN_RETURN_IF_ERROR(env_->NewWritableFile(tmp, &f));
  Status st;
  uint64_t written = 0;
  for (const Piece& p : pieces) {
    if (st.ok()) st = f->Append(p.data, p.len);
    if (st.ok()) written += p.len;
  }
  if (st.ok()) st = f->Sync();
  Status closed = f->Close();
  if (st.ok()) st = closed;
  f.reset();
  if (st.ok()) st = env_->RenameFile(tmp, path);
  if (!st.ok()) {
    (void)env_->DeleteFile(tmp);  // best effort: give back the space (ENOSPC)
    return st;
  }
  Count(&PersistProgress::bytes_written, written);
  return Status::Ok();
}

// A chunk file written under its tmp name, not yet synced. Whoever drops
// it before Commit (an error, a cancel, a job dropped after another failed)
// closes it and deletes the tmp file, giving the space back.
struct PersistWriter::PendingChunk {
  PersistWriter* writer;
  ChunkRef ref;
  std::string path, tmp;
  std::unique_ptr<WritableFile> file;
  bool renamed = false;
  ~PendingChunk() {
    if (renamed) return;
    if (file) (void)file->Close();
    file.reset();
    if (!tmp.empty()) (void)writer->env_->DeleteFile(tmp);
  }
};

// On a write worker: the hash check, the tmp file, its header and bytes;
// then the file goes to the sync workers, and this worker to the next chunk.
Status PersistWriter::WriteChunk(const ChunkRef& ref, const void* data, const std::string& subdir,
                                 const std::string& which, IoWorkers* syncs) {
  if (cancel_) return Stopped();
  if (options_.verify_source && HashBytes(data, ref.length) != ref.hash) {
    return Status::Corruption("the bytes of " + which + " in memory do not match their hash; not written");
  }
  auto chunk = std::make_shared<PendingChunk>();
  chunk->writer = this;
  chunk->ref = ref;
  chunk->path = subdir + "/" + ref.hash.ToHex();
  const std::string tmp = TmpName(chunk->path, options_.node);
  FTRUN_RETURN_IF_ERROR(env_->NewWritableFile(tmp, &chunk->file));
  chunk->tmp = tmp;
  // Block-aligned, like the arena's chunks: PosixEnv writes both without a copy.
  alignas(4096) char header[kChunkHeaderSize];
  EncodeChunkHeader(ref.hash, ref.length, header);
  FTRUN_RETURN_IF_ERROR(chunk->file->Append(header, sizeof(header)));
  FTRUN_RETURN_IF_ERROR(chunk->file->Append(data, static_cast<size_t>(ref.length)));
  return syncs->Submit([this, chunk] { return CommitChunk(chunk.get()); });
}

// On a sync worker: sync, close, rename. Several run at once, while the
// write workers keep the disk busy with the next files.
Status PersistWriter::CommitChunk(PendingChunk* chunk) {
  if (cancel_) return Stopped();
  FTRUN_RETURN_IF_ERROR(chunk->file->Sync());
  Status closed = chunk->file->Close();
  chunk->file.reset();
  FTRUN_RETURN_IF_ERROR(closed);
  FTRUN_RETURN_IF_ERROR(env_->RenameFile(chunk->tmp, chunk->path));
  chunk->renamed = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_.insert(chunk->ref.hash);
  }
  Count(&PersistProgress::bytes_written, kChunkHeaderSize + chunk->ref.length);
  Count(&PersistProgress::chunks_written, 1);
  Count(&PersistProgress::chunk_bytes_written, chunk->ref.length);
  return Status::Ok();
}

Status PersistWriter::WriteChunks(const std::vector<const Manifest*>& manifests, const ChunkSource& source,
                                  SyncPlan* plan) {
  const size_t threads = static_cast<size_t>(std::max(options_.io_threads, 0));
  // Files written and not yet synced are bounded by the sync queue: a write
  // worker waits for room before it takes the next chunk.
  IoWorkers syncs(options_.io_threads, 4 * std::max<size_t>(threads, 1), options_.io_nice);
  IoWorkers writes(options_.io_threads, 2 * threads, options_.io_nice);
  Status st = QueueChunks(manifests, source, &writes, &syncs, plan);
  Status written = writes.Finish();  // every write job ran or was dropped: no more Submit to syncs
  Status synced = syncs.Finish();    // no worker touches the disk after this
  if (!st.ok()) return st;
  return written.ok() ? synced : written;
}

// Runs on the calling thread: existence checks, the source callback, the
// hash check and the rate limit; the workers write.
Status PersistWriter::QueueChunks(const std::vector<const Manifest*>& manifests, const ChunkSource& source,
                                  IoWorkers* writes, IoWorkers* syncs, SyncPlan* plan) {
  std::unordered_set<ChunkHash, ChunkHashHasher> seen;
  for (const Manifest* m : manifests) {
    for (const TensorManifest& t : m->tensors) {
      for (size_t i = 0; i < t.chunks.size(); ++i) {
        const ChunkRef& ref = t.chunks[i];
        if (!seen.insert(ref.hash).second) continue;
        if (cancel_) return Stopped();
        const std::string subdir = ChunkSubdir(job_dir_, ref.hash);
        uint64_t size = 0;
        if (env_->GetFileSize(subdir + "/" + ref.hash.ToHex(), &size).ok() && size == kChunkHeaderSize + ref.length) {
          Count(&PersistProgress::chunks_skipped, 1);
          Count(&PersistProgress::chunk_bytes_skipped, ref.length);
          if (!durable_.count(ref.hash)) {  // e.g. left by a failed or cancelled write
            plan->dirs.insert(subdir);
            NeedDir(subdir, plan);
          }
          continue;
        }
        FTRUN_RETURN_IF_ERROR(env_->CreateDir(subdir));
        NeedDir(subdir, plan);
        const void* data = nullptr;
        const std::string which = "rank " + std::to_string(m->rank) + " tensor '" + t.info.name + "' chunk #" +
                                  std::to_string(i) + " (" + ref.hash.ToHex() + ")";
        FTRUN_RETURN_IF_ERROR(source(ref, &data).Annotate("cannot get the bytes of " + which));
        FTRUN_RETURN_IF_ERROR(Pace(kChunkHeaderSize + ref.length));
        plan->dirs.insert(subdir);
        FTRUN_RETURN_IF_ERROR(writes->Submit(
            [this, ref, data, subdir, which, syncs] { return WriteChunk(ref, data, subdir, which, syncs); }));
      }
    }
  }
  plan->chunks = std::move(seen);
  return Status::Ok();
}

Status PersistWriter::WriteVersion(uint64_t version, const std::vector<const Manifest*>& manifests,
                                   const ChunkSource& source) {
  return WriteVersion(version, 0, manifests, source);
}

Status PersistWriter::WriteVersion(uint64_t version, uint64_t epoch, const std::vector<const Manifest*>& manifests,
                                   const ChunkSource& source, std::optional<uint64_t> generation) {
  const uint64_t token = generation ? *generation : this->generation();
  writing_ = "version " + std::to_string(version);
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_.clear();
    written_version_.reset();
  }
  FTRUN_RETURN_IF_ERROR(CheckArgs(version, manifests));
  if (cancel_) return Stopped();
  std::vector<std::string> files;
  NodeMarker marker{options_.job_id, options_.world_size, version, options_.node, {}};
  marker.epoch = epoch;
  for (const Manifest* m : manifests) {
    files.push_back(EncodeManifestFile(options_.job_id, options_.world_size, *m));
    marker.ranks.push_back({m->rank, files.back().size(), FileChecksum(files.back())});
  }
  bool done = false;
  FTRUN_RETURN_IF_ERROR(CheckOwnMarker(version, marker, &done));
  if (done) {
    Count(&PersistProgress::versions_already_complete, 1);
    std::lock_guard<std::mutex> lock(mu_);
    written_version_ = version;
    return Status::Ok();
  }
  const std::string context = "persist: writing " + writing_ + " to '" + job_dir_ + "'";
  const std::string vdir = VersionDir(job_dir_, version);
  SyncPlan plan;
  Status st = MakeDirs(version, &plan);
  for (size_t i = 0; i < files.size() && st.ok(); ++i) {
    st = Pace(files[i].size());
    if (st.ok()) {
      st = WriteFileAtomically(vdir + "/" + ManifestFileName(manifests[i]->rank), {{files[i].data(), files[i].size()}});
    }
  }
  if (st.ok()) st = WriteChunks(manifests, source, &plan);
  if (!st.ok()) return st.code() == Code::kUnavailable ? st : st.Annotate(context);
  // Every directory a name was added to, several at a time. The order among
  // them does not matter: nothing counts before the marker, which comes
  // after all of them.
  {
    IoWorkers syncs(options_.io_threads, plan.dirs.size(), options_.io_nice);
    for (const auto& d : plan.dirs) {
      st = syncs.Submit([this, d] {
        FTRUN_RETURN_IF_ERROR(env_->SyncDir(d));
        Count(&PersistProgress::dirs_synced, 1);
        return Status::Ok();
      });
      if (!st.ok()) break;
    }
    Status synced = syncs.Finish();
    if (st.ok()) st = synced;
  }
  if (st.ok()) {
    std::string bytes = EncodeNodeMarker(marker);
    st = Pace(bytes.size());
    if (st.ok()) st = WriteMarker(vdir + "/" + NodeMarkerName(options_.node), bytes, token);
  }
  if (st.ok()) st = env_->SyncDir(vdir);
  if (!st.ok()) return st.code() == Code::kUnavailable ? st : st.Annotate(context);
  // The next version mostly shares this one's chunks: remember only these.
  durable_ = std::move(plan.chunks);
  durable_dirs_.insert(plan.now_durable.begin(), plan.now_durable.end());
  Count(&PersistProgress::versions_written, 1);
  std::lock_guard<std::mutex> lock(mu_);
  written_version_ = version;
  return Status::Ok();
}

Status PersistWriter::PaceRead(uint64_t n, const std::atomic<bool>* stop) { return Pace(n, stop); }

}  // namespace ftrun
