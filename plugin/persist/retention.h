// Retention: keeps the newest `keep` complete versions of a job on disk, and
// the version the job would restore from, and deletes the rest once a newer
// version is complete; then deletes chunk files that no remaining version
// references.
//
// What goes:
//  - complete versions older than the newest `keep` complete ones, except
//    `protect`;
//  - incomplete versions older than the newest complete one (abandoned by a
//    crash or a cancelled write). Incomplete versions newer than it stay: a
//    writer may be busy with them.
// Nothing goes while no version is complete. A version is deleted marker
// first, then the directory is synced, then the rest: a crash half-way
// leaves an incomplete version, never a complete one with files missing.
//
// Chunks: the live set is every chunk named by a manifest file in any
// remaining version directory, complete or not (writers put manifests down
// before chunks, so a version being written keeps its chunks). If a manifest
// cannot be read the collection is skipped rather than risk a live chunk.
// This node's own *.tmp files are removed too.
//
// The race with another node's writer (a shared directory): the live set is
// read at some instant; a writer whose manifest appears just after it may
// find a dead chunk still there, skip writing it, and then see it deleted.
// So deletes are bounded in time and writers re-check: retention deletes no
// chunk file later than kChunkGcGrace / 2 after it started reading the live
// set (the rest waits for the next run), and a writer, at least
// kChunkGcGrace after its manifests were durable, checks that every chunk
// of the version is on disk (rewriting any that went) before its marker
// (persist_writer.h). A chunk deleted on the strength of a live set that
// missed a manifest was deleted before that manifest's time + grace / 2, so
// the writer's check sees it gone. The two sides measure durations on their
// own monotonic clocks; grace / 2 is the margin for a slow delete call.
//
// Precondition: no writer of this node writes the same job meanwhile (the
// agent runs retention on its flusher thread, between versions). On a shared
// filesystem run it on one node only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/env.h"

namespace ftrun {

// The bound on retention's deletes and writers' re-checks (see above).
// 2 s: what a small version written on a node other than 0 waits at most
// before its marker; retention then deletes for 1 s per run (the rest of a
// large collection waits for the next run), which leaves 1 s of margin for
// an unlink that is slow to return.
inline constexpr std::chrono::milliseconds kChunkGcGrace{2000};

struct RetentionOptions {
  std::string dir;  // persist root
  std::string job_id;
  int keep = 2;                     // persist.keep: complete versions kept, >= 1
  std::optional<uint64_t> protect;  // never deleted: the version the job would restore from
  int node = 0;                     // whose *.tmp files to remove
  Env* env = nullptr;               // nullptr = PosixEnv()
  // No chunk file is deleted later than this after the live set was first
  // read (see above); tests shorten it.
  std::chrono::nanoseconds delete_window = kChunkGcGrace / 2;
};

struct RetentionResult {
  std::vector<uint64_t> kept;     // complete versions kept, newest first
  std::vector<uint64_t> deleted;  // version directories deleted, oldest first
  uint64_t chunks_deleted = 0;
  uint64_t bytes_freed = 0;  // chunk and tmp files
  std::string gc_skipped;    // why chunks were not collected; "" when they were
  uint64_t chunks_deferred = 0;  // dead, left for the next run (past delete_window)
};

Status ApplyRetention(const RetentionOptions& options, RetentionResult* result);

// Deletes every version above `version` (markers first), complete or not:
// after a job restores `version`, the versions above it on disk belong to a
// timeline that no longer exists, and new saves will reuse their numbers.
// Uses dir, job_id and env of `options`; *deleted (if given) lists them,
// oldest first. Their chunks go at the next ApplyRetention.
Status DiscardVersionsAbove(const RetentionOptions& options, uint64_t version, std::vector<uint64_t>* deleted);

}  // namespace ftrun
