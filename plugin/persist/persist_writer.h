// PersistWriter: writes committed versions to the persist directory (the
// lazy flusher's disk side). Each call writes one version's manifests for
// the ranks this node owns, every chunk they reference that is not on disk
// yet, and last this node's COMPLETE marker (layout: disk_format.h).
//
// Crash consistency. Every file is written under a tmp name, synced, and
// renamed; so a name that looks final is never torn, and a chunk file that
// exists under its hash holds the synced bytes of that hash (the reader
// still checks the hash on every read, against bit rot, and the flusher's
// scrub, scrub.h, reads back once the files a version reuses and rewrites a
// rotten one with RewriteChunk). The order is:
//   1. manifests (tmp, sync, rename), first so that retention running
//      elsewhere sees the chunks this version will reference;
//   2. chunks not on disk yet (tmp, sync, rename). Write threads write tmp
//      files (not synced) and hand each to a sync thread, which syncs,
//      closes and renames it; at most 4 x io_threads files wait for a sync.
//      So the disk is sent the next files' bytes while others are synced,
//      and a chunk's final name still appears only after its bytes are
//      durable;
//   3. fsync of every directory a name was added to: chunk subdirectories
//      (also those of skipped chunks not known to be durable), chunks/, the
//      version directory, the job directory, the root;
//   4. node<n>.COMPLETE (tmp, sync, rename), then fsync of the version dir.
// A version is complete when the markers of all nodes cover every rank; a
// crash anywhere before leaves an incomplete version the reader ignores.
// Writing a version whose marker from this node is already there does
// nothing, so a retry never rewrites the files of a complete version. If
// that marker records other manifests (the job went back to an older
// version and saved this number again), the write is refused: versions
// above a restored one must be discarded first (DiscardVersionsAbove in
// retention.h), on every node, before new ones are written.
//
// Threads: WriteVersion runs on one thread at a time (the flusher's), which
// also calls the ChunkSource and paces the rate limit; io_threads write
// workers (hash check, tmp file) and as many sync workers (sync, close,
// rename; then the directories) do the rest meanwhile, at nice io_nice, and
// are joined before WriteVersion returns. The scrub (scrub.h) uses PaceRead
// and RewriteChunk on that same thread, between WriteVersion calls. Cancel,
// ClearCancel, cancelled and Progress may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/disk_format.h"
#include "plugin/persist/env.h"
#include "plugin/persist/rate_limiter.h"
#include "plugin/store/manifest.h"

namespace ftrun {

class IoWorkers;

// Gives the bytes of a chunk (chunk.length of them, which must hash to
// chunk.hash). They must stay valid and unchanged until WriteVersion returns:
// the agent pins the version while it is written.
using ChunkSource = std::function<Status(const ChunkRef& chunk, const void** data)>;

struct PersistWriterOptions {
  std::string dir;          // persist.dir: the root; created if missing (one level)
  std::string job_id;       // names <dir>/<job_id>; recorded in every file
  int world_size = 0;       // ranks in the job
  int node = 0;             // this agent's node: names its marker and tmp files
  uint64_t rate_limit = 0;  // bytes/s over all bytes written; 0 = unlimited
  uint64_t burst = 0;       // token bucket size; 0 = RateLimiter's default
  // Hash chunk bytes before writing them under that hash. Cheap (XXH3, ~30
  // GB/s on a worker thread) and worth it: a chunk file is shared by every
  // later version that has those bytes, so one written wrong would poison all
  // of them, and the store does not re-check what ranks copied into it.
  bool verify_source = true;
  // Write threads and as many sync threads (and directory syncs at once);
  // 0 = everything on the caller. Each write thread has one chunk file at a
  // time in flight (PosixEnv: O_DIRECT from the caller's memory, 4 x 1 MiB
  // writes at once); a written file goes to a sync thread, so the disk keeps
  // receiving writes while files are synced. On this project's virtio disk,
  // 1 GiB versions of 4 MiB chunks: ~1.5-1.8 GB/s with 4, about what fio does
  // at its best there (docs/benchmarks.md, "flush").
  int io_threads = 4;
  // Nice value the I/O threads give themselves (Linux, per thread): their
  // CPU time - the hash check, and the filesystem's, which on a journal-less
  // ext4 with many recently deleted files dominates - goes to the training
  // ranks on the same node first. 0 = the caller's priority.
  int io_nice = 19;
  Env* env = nullptr;  // nullptr = PosixEnv()
  // Asked under the marker lock right before the marker's rename (after
  // the generation check): a non-ok answer (kUnavailable) and the marker is
  // not written. The agent's lease: an agent that has not heard from its
  // coordinator lately (frozen, cut off, fenced) may have been replaced, and
  // a write it had in flight must not complete a version. nullptr = always.
  std::function<Status()> marker_guard;
  // Tests: replace steady_clock::now and the cancellable wait of the rate limit.
  std::function<std::chrono::steady_clock::time_point()> clock;
  std::function<void(std::chrono::nanoseconds)> sleep;
};

struct PersistProgress {
  uint64_t versions_written = 0;
  uint64_t versions_already_complete = 0;  // this node's marker was there
  uint64_t bytes_written = 0;              // everything appended: chunks and headers, manifests, markers
  uint64_t chunks_written = 0;
  uint64_t chunk_bytes_written = 0;  // chunk payload only
  uint64_t chunks_skipped = 0;       // already on disk
  uint64_t chunk_bytes_skipped = 0;
  uint64_t dirs_synced = 0;
  uint64_t throttle_ns = 0;  // waits the rate limit asked for
};

class PersistWriter {
 public:
  explicit PersistWriter(PersistWriterOptions options);
  PersistWriter(const PersistWriter&) = delete;
  PersistWriter& operator=(const PersistWriter&) = delete;

  // Writes `version` for the ranks of `manifests` (each with that version, a
  // rank in [0, world_size), no rank twice). Errors name the file and the
  // version; on an error nothing complete was touched and a later call for
  // the same version picks up where this one stopped. After Cancel it stops
  // between writes with kUnavailable.
  //
  // `epoch` is the timeline of the version (the coordinator epoch it was
  // committed in); the marker records it and a version is complete only
  // when all its markers agree (version_scan.h). `generation` is what
  // generation() returned when the caller decided to write this version
  // (default: now): once a Cancel came after that, the marker is never
  // written, even after ClearCancel - checked under the lock Cancel takes,
  // right before the marker's rename, so a write stuck in a syscall across
  // a Cancel/ClearCancel cannot complete a version of a timeline the job
  // left (the flusher's Rewind).
  Status WriteVersion(uint64_t version, const std::vector<const Manifest*>& manifests, const ChunkSource& source);
  Status WriteVersion(uint64_t version, uint64_t epoch, const std::vector<const Manifest*>& manifests,
                      const ChunkSource& source, std::optional<uint64_t> generation = std::nullopt);

  // Makes the running and every later WriteVersion (and scrub) stop, until
  // ClearCancel; every write that started (or was decided) before it can
  // never write its marker. When Cancel returns, a marker rename is either
  // done or will never happen.
  void Cancel();
  void ClearCancel();
  bool cancelled() const { return cancel_; }
  uint64_t generation() const;  // counts Cancel calls
  PersistProgress Progress() const;

  // For the scrub (scrub.h), which checks the chunk files a version shares
  // with older ones:
  // The chunks the last WriteVersion wrote itself, if it was for `version`
  // and succeeded; none when it found the version complete already.
  std::unordered_set<ChunkHash, ChunkHashHasher> WrittenChunks(uint64_t version) const;
  // Takes n bytes read from the rate limit the writes are paced by, so that
  // reads and writes together stay under it; kUnavailable after Cancel, or
  // once *stop (if given) is true: Interrupt wakes the wait to look at it.
  Status PaceRead(uint64_t n, const std::atomic<bool>* stop = nullptr);
  void Interrupt();
  // Replaces the file of chunk ref.hash with `data`, the way a new chunk is
  // written (tmp, sync, rename, its directory synced), paced like one. The
  // bytes are hashed first whatever verify_source says: kCorruption, and
  // nothing written, when they do not match ref.hash. `which` names the
  // chunk in errors.
  Status RewriteChunk(const ChunkRef& ref, const void* data, const std::string& which);
  const PersistWriterOptions& options() const { return options_; }
  Env* env() const { return env_; }

 private:
  struct Piece {
    const void* data;
    size_t len;
  };
  Status CheckArgs(uint64_t version, const std::vector<const Manifest*>& manifests) const;
  // *done when this node's marker for `version` is there with these
  // manifests; kFailedPrecondition when it is there with other ones.
  Status CheckOwnMarker(uint64_t version, const NodeMarker& want, bool* done);
  // What one WriteVersion must sync before its marker, and what it then
  // knows to be durable.
  struct SyncPlan {
    std::set<std::string> dirs;
    std::vector<std::string> now_durable;                   // directories
    std::unordered_set<ChunkHash, ChunkHashHasher> chunks;  // this version's
  };
  void NeedDir(const std::string& dir, SyncPlan* plan) const;
  Status MakeDirs(uint64_t version, SyncPlan* plan);
  Status WriteChunks(const std::vector<const Manifest*>& manifests, const ChunkSource& source, SyncPlan* plan);
  Status QueueChunks(const std::vector<const Manifest*>& manifests, const ChunkSource& source, IoWorkers* writes,
                     IoWorkers* syncs, SyncPlan* plan);
  struct PendingChunk;
  Status WriteChunk(const ChunkRef& ref, const void* data, const std::string& subdir, const std::string& which,
                    IoWorkers* syncs);
  Status CommitChunk(PendingChunk* chunk);
  // tmp name, append the pieces, sync, close, rename. Callers pace first.
  Status WriteFileAtomically(const std::string& path, const std::vector<Piece>& pieces);
  // The node marker: like WriteFileAtomically, renamed only if no Cancel
  // came since `token` (see WriteVersion).
  Status WriteMarker(const std::string& path, const std::string& bytes, uint64_t token);
  Status Pace(uint64_t n, const std::atomic<bool>* stop = nullptr);
  Status Stopped() const;
  void Count(uint64_t PersistProgress::*field, uint64_t n);

  // Constant after construction
  const PersistWriterOptions options_;
  Env* const env_;
  const std::string job_dir_;

  // Used by the WriteVersion thread only (workers read job_dir_, writing_)
  RateLimiter limiter_;
  std::unordered_set<ChunkHash, ChunkHashHasher> durable_;  // chunks whose names are synced
  std::set<std::string> durable_dirs_;                      // directories whose names are synced
  std::string writing_;                                     // "version N" for messages

  std::atomic<bool> cancel_{false};
  // Guarded by marker_mu_: bumped by every Cancel. The marker's rename runs
  // under marker_mu_ after checking it, so Cancel and a marker are ordered.
  mutable std::mutex marker_mu_;
  uint64_t generation_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // wakes the rate limit's wait on Cancel
  PersistProgress progress_;    // Guarded by mu_
  // Guarded by mu_: what the last successful WriteVersion wrote (sync workers
  // add to `written_` as chunks are renamed; WriteVersion sets the version).
  std::unordered_set<ChunkHash, ChunkHashHasher> written_;
  std::optional<uint64_t> written_version_;
};

}  // namespace ftrun
